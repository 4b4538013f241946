package capacity

import (
	"context"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// Metrics of a transcoding run (the pod's rtcedge_realtime_* series).
const (
	metricToBackend = `rtcedge_realtime_audio_seconds_total{direction="to_backend"}`
	metricToCaller  = `rtcedge_realtime_audio_seconds_total{direction="to_caller"}`
	metricRTDropped = "rtcedge_realtime_dropped_total"
)

// Conversation is the shape of every transcoding call's audio: the caller
// talks (a 440 Hz tone) for TalkMs, then is silent for SilenceMs, over and
// over, sending packets all the time as a browser does without DTX; the
// reference server's VAD ends each turn and its parrot replies with at most
// ReplyMs of the turn (0: all of it, the turn with its 300 ms prefix and
// the 500 ms of silence that ended it).
type Conversation struct {
	TalkMs, SilenceMs, ReplyMs int
}

// Conversations are the shapes the capacity command offers (-conversation).
var Conversations = map[string]Conversation{
	// turns: a conversation. The caller talks 2 s of every 5 (40 %), the
	// model replies 2 s from 0.5 s after the caller stops (40 %), and both
	// are silent the remaining 20 %.
	"turns": {TalkMs: 2000, SilenceMs: 3000, ReplyMs: 2000},
	// continuous: both sides talk nearly all the time. The caller talks 1 s
	// of every 2 (its packets decoded all the time), the model replies
	// 1.8 s of every 2 (90 %). The worst case for the codec.
	"continuous": {TalkMs: 1000, SilenceMs: 1000},
}

// CallerShare and ModelShare are the parts of the time the caller and the
// model talk.
func (c Conversation) CallerShare() float64 {
	return float64(c.TalkMs) / float64(c.TalkMs+c.SilenceMs)
}

// ModelShare: see CallerShare.
func (c Conversation) ModelShare() float64 {
	reply := c.TalkMs + 800 // the parrot: prefix padding and the silence that ended the turn
	if c.ReplyMs > 0 {
		reply = min(reply, c.ReplyMs)
	}
	return float64(reply) / float64(c.TalkMs+c.SilenceMs)
}

// startBackend prepares RunConfig.Backend: "" is the pod's echo; "ref" a
// reference Realtime server in this process on a loopback port (replies
// sent as fast as they go, capped at conv.ReplyMs, 1 s of each session's
// input recorded); anything else a Realtime server's URL. For a Realtime
// backend it returns the pod's config lines and the callers' audio
// (TurnFrames); stop ends what it started.
func startBackend(ctx context.Context, backend string, conv Conversation) (podConfig string, frames [][]byte, stop func(), err error) {
	stop = func() {}
	if backend == "" {
		return "", nil, stop, nil
	}
	if frames, err = TurnFrames(conv); err != nil {
		return "", nil, stop, err
	}
	url := backend
	if backend == "ref" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, stop, err
		}
		srv, err := refserver.New(refserver.Config{RecordMs: 1000, MaxReplyMs: conv.ReplyMs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, ln)
		if err != nil {
			ln.Close()
			return "", nil, stop, err
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Run(ctx) }()
		stop = func() { _ = srv.Close(); <-done }
		url = srv.URL() + "?model=capacity"
	}
	return "backend_url: " + url + "\n", frames, stop, nil
}

// TurnFrames is a caller's turn as 20 ms Opus frames at 48 kHz, encoded as
// a browser does (opus.NewVoIPEncoder): a 440 Hz tone for conv.TalkMs, then
// conv.SilenceMs of silence.
func TurnFrames(conv Conversation) ([][]byte, error) {
	enc, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	ms := time.Millisecond
	pcm := append(audiotest.Tone(48000, 440, 0.3, time.Duration(conv.TalkMs)*ms), make([]int16, audiotest.Samples(48000, time.Duration(conv.SilenceMs)*ms))...)
	var frames [][]byte
	buf := make([]byte, opus.MaxPacket)
	for i := 0; i+frameSamples <= len(pcm); i += frameSamples {
		n, err := enc.Encode(pcm[i:i+frameSamples], buf)
		if err != nil {
			return nil, err
		}
		frames = append(frames, append([]byte(nil), buf[:n]...))
	}
	return frames, nil
}
