package transceiver

import (
	"encoding/json"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/transceiver/pace"
	"github.com/rtcedge/rtcedge/transceiver/vad"
)

// The session's side of paced output and barge-in (package pace): it is the
// queue's pace.Output (the frames go out as RTP, the response events go to
// the caller) and the backend's backend.Player. Every event the pod makes
// goes out through SendEvent, the session's one event path.

var eventSeq atomic.Uint64 // event_id suffix of the events the pod makes

// podEvent sends one event the pod makes on the caller's data channel.
func (s *session) podEvent(fields map[string]any) {
	fields["event_id"] = backend.EventIDPrefix + strconv.FormatUint(eventSeq.Add(1), 10)
	b, err := json.Marshal(fields)
	if err != nil {
		return
	}
	_ = s.SendEvent(b) // dropped and counted by SendEvent when the channel is gone or full
}

// popLabel is the pop label of the turn metrics: the ID of the POP the
// session's selected path goes through (as in the session API's pops),
// "0" before one is selected.
func (s *session) popLabel() string {
	return strconv.FormatUint(uint64(s.selectedPOP.Load()), 10)
}

// Started implements pace.Output: output_audio_buffer.started, and the
// turn's reply delay when the end of the caller's speech is known.
func (s *session) Started(responseID string, replyDelay time.Duration) {
	s.podEvent(map[string]any{"type": "output_audio_buffer.started", "response_id": responseID})
	if replyDelay >= 0 {
		s.t.m.replyDelay.WithLabelValues(s.popLabel()).Observe(replyDelay.Seconds())
		s.podEvent(map[string]any{"type": backend.EventTurn, "response_id": responseID, "reply_delay_ms": replyDelay.Milliseconds()})
	}
}

// Stopped implements pace.Output: output_audio_buffer.stopped.
func (s *session) Stopped(responseID string) {
	s.podEvent(map[string]any{"type": "output_audio_buffer.stopped", "response_id": responseID})
}

// BeginItem implements backend.Player.
func (s *session) BeginItem(responseID, itemID string) { s.play.BeginItem(responseID, itemID) }

// EndResponse implements backend.Player.
func (s *session) EndResponse(responseID string) { s.play.EndResponse(responseID) }

// AwaitStart implements backend.StartAwaiter: at most two rounds of the
// scheduler, so a late wheel delays the backend's reader only that long.
func (s *session) AwaitStart(responseID string) { s.play.AwaitStart(responseID, 2*opus.FrameDuration) }

// SpeechStopped implements backend.Player.
func (s *session) SpeechStopped() { s.play.SpeechStopped(time.Now()) }

// Clear implements backend.Player: a barge-in the backend saw (its VAD,
// or the caller's output_audio_buffer.clear), whose onset is now.
func (s *session) Clear(source string) (string, time.Duration, bool) {
	c := s.clearReply(source, time.Now())
	return c.ItemID, c.Played, c.Active
}

// clearReply drops the queued reply and, if one was playing, tells the caller
// (output_audio_buffer.cleared) and counts the barge-in.
func (s *session) clearReply(source string, onset time.Time) pace.Cleared {
	c := s.play.Clear()
	if !c.Active {
		return c
	}
	stop := max(0, c.LastReply.Sub(onset))
	s.t.m.bargeins.WithLabelValues(source).Inc()
	s.t.m.bargeinStop.WithLabelValues(s.popLabel()).Observe(stop.Seconds())
	s.podEvent(map[string]any{"type": "output_audio_buffer.cleared", "response_id": c.ResponseID})
	s.podEvent(map[string]any{"type": backend.EventTurn, "response_id": c.ResponseID, "item_id": c.ItemID, "bargein_source": source,
		"bargein_stop_ms": stop.Milliseconds(), "audio_end_ms": c.Played.Milliseconds()})
	return c
}

// edgeVAD runs the edge's detector on one caller frame, for a backend
// without VAD of its own (s.interrupter): speech over a playing reply
// clears it, and the end of speech starts the reply-delay clock. Called on
// the audio path under audioMu.
func (s *session) edgeVAD(p []byte) {
	now := time.Now()
	switch s.vad.Frame(p, now) {
	case vad.SpeechStarted:
		if !s.play.Playing() {
			return
		}
		if c := s.clearReply(backend.ClearEdge, s.vad.Onset()); c.Active {
			s.interrupter.Interrupted(backend.ClearEdge, c.ItemID, c.Played)
		}
	case vad.SpeechStopped:
		s.play.SpeechStopped(s.vad.Onset())
		s.interrupter.SpeechStopped()
	}
}
