package capacity

import (
	"errors"
	"math"
	"testing"

	"github.com/rtcedge/rtcedge/internal/opus"
)

// TestConversations: the shapes say what they claim (turns: caller 40 %,
// model 40 %), and the callers' frames are a browser's: active at the
// tone's start, marked inactive by the encoder's VAD in the pause (and
// after about 0.8 s of the steady tone, which the connector still decodes:
// opus.Quiet).
func TestConversations(t *testing.T) {
	turns := Conversations["turns"]
	if c, m := turns.CallerShare(), turns.ModelShare(); math.Abs(c-0.4) > 1e-9 || math.Abs(m-0.4) > 1e-9 {
		t.Errorf("turns: caller %.2f, model %.2f, want 0.4 and 0.4", c, m)
	}
	if m := Conversations["continuous"].ModelShare(); math.Abs(m-0.9) > 1e-9 {
		t.Errorf("continuous: model %.2f, want 0.9", m)
	}
	frames, err := TurnFrames(turns)
	if errors.Is(err, opus.ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 250 {
		t.Fatalf("%d frames, want 250 (5 s)", len(frames))
	}
	talk := turns.TalkMs / 20
	for i, f := range frames {
		if i < talk/4 && opus.Inactive(f) {
			t.Errorf("frame %d of the tone inactive", i)
		}
		if i >= talk+10 && !opus.Inactive(f) { // past the VAD's release
			t.Errorf("frame %d of the pause active", i)
		}
	}
}
