package capacity

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// Metrics of a transcoding run (the pod's rtcedge_realtime_* series).
const (
	metricToBackend = `rtcedge_realtime_audio_seconds_total{direction="to_backend"}`
	// What the pod paced out to the callers and dropped (barge-in, full
	// queue) of the backends' replies.
	metricReplySent    = `rtcedge_reply_audio_seconds_total{state="sent"}`
	metricReplyDropped = `rtcedge_reply_audio_seconds_total{state="dropped"}`
	metricRTDropped    = "rtcedge_realtime_dropped_total"
	// metricRTFailed is the calls the connector ended from the backend's
	// side by its reason (backend_closed, backend_stalled, ...).
	metricRTFailed = "rtcedge_realtime_sessions_failed_total"
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
// reference Realtime server (`bin realtime-ref`, its own process, so that
// its CPU time is read apart from the load generator's and the pod's) on
// a loopback port, replies capped at conv.ReplyMs, 1 s of each session's
// input recorded; anything else a Realtime server's URL. For a Realtime
// backend it returns the pod's config lines and the callers' audio
// (TurnFrames); ref is the reference server's process when it started
// one (stop it with Stop).
func startBackend(ctx context.Context, bin, backend string, conv Conversation, profileDir string, cpus []int) (podConfig string, frames [][]byte, ref *RefServer, err error) {
	if backend == "" {
		return "", nil, nil, nil
	}
	if frames, err = TurnFrames(conv); err != nil {
		return "", nil, nil, err
	}
	url := backend
	if backend == "ref" {
		if ref, err = StartRefServer(ctx, bin, conv, profileDir, cpus); err != nil {
			return "", nil, nil, err
		}
		url = ref.URL
	}
	return "backend_url: " + url + "\n", frames, ref, nil
}

// RefServer is the reference Realtime server running as its own process
// (`rtcedge realtime-ref`).
type RefServer struct {
	cmd        *exec.Cmd
	done       chan struct{}
	profileDir string
	URL        string // what the pod's backend_url names
}

// StartRefServer starts `bin realtime-ref` on a loopback port with the
// replies capped for conv, and waits for the URL it prints. With
// profileDir set, StartProfile and StopProfile profile it there. With cpus
// set, it runs pinned to them (taskset, GOMAXPROCS their count).
func StartRefServer(ctx context.Context, bin string, conv Conversation, profileDir string, cpus []int) (*RefServer, error) {
	args := []string{"realtime-ref", "-addr", "127.0.0.1:0", "-record-ms", "1000", "-log-level", "warn"}
	if conv.ReplyMs > 0 {
		args = append(args, "-max-reply-ms", strconv.Itoa(conv.ReplyMs))
	}
	argv, env := pinnedCommand(cpus, bin, args...)
	r := &RefServer{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{}), profileDir: profileDir}
	r.cmd.Stderr = os.Stderr
	r.cmd.Env = append(os.Environ(), env...)
	if profileDir != "" {
		if err := os.MkdirAll(profileDir, 0o755); err != nil {
			return nil, err
		}
		r.cmd.Env = append(r.cmd.Env, "RTCEDGE_PROFILE_DIR="+profileDir)
	}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start realtime-ref: %w", err)
	}
	up := make(chan string, 1)
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			// "Realtime reference server at ws://HOST:PORT/v1/realtime?model=ref (GA, 24000 Hz)"
			if _, rest, ok := strings.Cut(sc.Text(), " server at "); ok {
				u, _, _ := strings.Cut(rest, " ")
				select {
				case up <- u:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = r.cmd.Wait()
	}()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	select {
	case r.URL = <-up:
		return r, nil
	case <-r.done:
		return nil, errors.New("capacity: realtime-ref exited before it was up")
	case <-ctx.Done():
		r.Stop()
		return nil, fmt.Errorf("realtime-ref not up: %w", ctx.Err())
	}
}

// Stat reads the reference server's /proc entries.
func (r *RefServer) Stat() (ProcStat, error) { return readProcStat(r.cmd.Process.Pid) }

// StartProfile starts a CPU profile of the server (SIGUSR1).
func (r *RefServer) StartProfile() error {
	return startProfile(r.cmd.Process, r.profileDir, "realtime-ref")
}

// StopProfile stops it and waits for the server's profiles.
func (r *RefServer) StopProfile(ctx context.Context) error {
	return stopProfile(ctx, r.cmd.Process, r.profileDir)
}

// Stop ends the reference server (SIGTERM, then SIGKILL after 5 s).
func (r *RefServer) Stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
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
