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

// startBackend prepares RunConfig.Backend: "" is the pod's echo; "ref" a
// reference Realtime server in this process on a loopback port (replies
// sent as fast as they go, 1 s of each session's input recorded); anything
// else a Realtime server's URL. For a Realtime backend it returns the
// pod's config lines and the callers' audio (TurnFrames); stop ends what
// it started.
func startBackend(ctx context.Context, backend string) (podConfig string, frames [][]byte, stop func(), err error) {
	stop = func() {}
	if backend == "" {
		return "", nil, stop, nil
	}
	if frames, err = TurnFrames(); err != nil {
		return "", nil, stop, err
	}
	url := backend
	if backend == "ref" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, stop, err
		}
		srv, err := refserver.New(refserver.Config{RecordMs: 1000, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, ln)
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

// TurnFrames is a caller's turn as 20 ms Opus frames at 48 kHz: a 440 Hz
// tone for 1 s, then 1 s of silence, so that a server VAD ends each turn
// and a parrot answers it (about 1.8 s of reply per 2 s: the turn with
// its prefix padding and the silence that ended it).
func TurnFrames() ([][]byte, error) {
	enc, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	pcm := append(audiotest.Tone(48000, 440, 0.3, time.Second), make([]int16, 48000)...)
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
