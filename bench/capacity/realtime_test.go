package capacity

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

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

// TestRunRealtimeRef runs the stepped measurement end to end at a few
// calls: the pod (`rtcedge transceiver`) behind the reference server
// (`rtcedge realtime-ref`, its own process), callers replayed from the
// queues, replies counted from their ciphertext. The callers must send at
// full rate, the server must hear them and the callers get its replies,
// and each process's CPU must be read.
func TestRunRealtimeRef(t *testing.T) {
	if _, err := TurnFrames(Conversations["turns"]); errors.Is(err, opus.ErrUnavailable) {
		t.Skip(err)
	}
	bin := buildRTCEdge(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	steps, err := Run(ctx, RunConfig{
		Bin: bin, Dir: t.TempDir(), Steps: []int{4}, Settle: time.Second, Window: 3 * time.Second,
		DataChannel: true, Backend: "ref",
		// A turn of 0.6 s, its reply (0.6 s) from 0.5 s after it ends.
		Conversation: Conversation{TalkMs: 600, SilenceMs: 1400, ReplyMs: 600},
	})
	if err != nil {
		t.Fatal(err)
	}
	st := steps[0]
	t.Logf("%+v", st)
	if st.Sessions != 4 || st.SentRatio < 0.9 || st.Lost != 0 {
		t.Errorf("%d calls, %.0f %% of the frames sent, %d lost; want 4 calls at full rate", st.Sessions, 100*st.SentRatio, st.Lost)
	}
	if st.ToBackend < 0.5 || st.Echoed == 0 {
		t.Errorf("%.2f s/s per call to the server, %d reply frames received", st.ToBackend, st.Echoed)
	}
	if st.Loss > 0.05 {
		t.Errorf("reply loss %.1f %% by sequence numbers", 100*st.Loss)
	}
	if st.PodCPU <= 0 || st.GenCPU <= 0 || st.RefCPU <= 0 {
		t.Errorf("CPU: pod %.3f, generator %.3f, reference server %.3f; want each read", st.PodCPU, st.GenCPU, st.RefCPU)
	}
}
