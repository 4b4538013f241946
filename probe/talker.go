package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// TalkConfig makes a probe call a synthetic talker (Config.Talk): instead
// of timestamped packets for the echo to return, it sends real Opus in
// turns, as a caller talking to a voice agent does, and measures each
// reply by decoding the audio it gets back. Its turns are tone bursts at
// TurnHz, its barge-ins at BargeInHz, so that it tells a reply (a model
// repeating or answering the turn; the echo backend returning it) from the
// echo of its own barge-in. A speech detector that needs real speech does
// not hear tones; the energy detectors of the reference server do.
type TalkConfig struct {
	// Turns is the number of plain turns before the last one, the barge-in
	// turn; default 2.
	Turns int
	// Speech is how long each plain turn talks; default 1s. The barge-in
	// turn talks twice as long, so that its reply lasts long enough to be
	// talked over.
	Speech time.Duration
	// BargeInAfter is how much of the barge-in turn's reply the talker
	// hears before it talks over it; default 300ms.
	BargeInAfter time.Duration
	// ReplyTimeout bounds the wait for a reply's first audio after the end
	// of the turn's speech; default 10s.
	ReplyTimeout time.Duration
}

// Frequencies of the talker's voice.
const (
	TurnHz    = 440.0
	BargeInHz = 990.0
)

const (
	// talkRate is the rate the talker decodes at: ample for its tones, a
	// third of 48 kHz's work.
	talkRate = 16000
	// voicedRMS is the level (fraction of full scale, -34 dBFS) from which
	// a decoded frame counts as audio; Opus-coded silence decodes far
	// below it, the talker's tones (0.3 peak) far above.
	voicedRMS = 0.02
	// replyQuiet is how long no reply audio must arrive for a reply to have
	// ended.
	replyQuiet = 400 * time.Millisecond
	// maxReply bounds a reply's length.
	maxReply = 30 * time.Second
	// leadIn is the silence the talker sends before its first turn: a
	// backend's speech detector sees a quiet start, as from a caller.
	leadIn = 500 * time.Millisecond
	// senderSlack bounds how far the sender may fall behind the script
	// (a loaded machine delays its ticks) before the talker gives up.
	senderSlack = 15 * time.Second
	// toneAmp is the tones' peak level (-10 dBFS), a loud talker.
	toneAmp = 0.3
)

// What the talker sends.
const (
	voiceSilence = iota
	voiceTurn
	voiceBargeIn
)

// Turn is what the talker measured of one turn, in milliseconds.
type Turn struct {
	BargeIn  bool    `json:"barge_in"`
	SpeechMs float64 `json:"speech_ms"`
	// Replied: reply audio arrived within the reply timeout.
	Replied bool `json:"replied"`
	// ReplyDelayMs is from the end of the talker's speech (its last voiced
	// frame sent) to the first reply audio received. It is negative when
	// the reply began while the talker still spoke, as the echo backend's
	// does (by the speech's length less the round trip).
	ReplyDelayMs float64 `json:"reply_delay_ms"`
	// ReplyMs is the reply audio received in the turn.
	ReplyMs float64 `json:"reply_ms"`
	// BargeInStopMs (barge-in turn) is from the talker's first frame over
	// the reply to the last reply audio received; 0 when the reply had
	// ended before.
	BargeInStopMs float64 `json:"barge_in_stop_ms"`
}

// talker is a call's voice: the sender goroutine takes its frames, the
// track's reader gives it what arrives, and the turn script (talk) drives
// both and reads the figures. mu guards everything below it.
type talker struct {
	cfg TalkConfig
	enc *opus.Encoder // the sender's (sendAudio); closed when it returns
	dec *opus.Decoder // the reader's (readTalk); closed when it returns

	// The sender's buffers and tone phase.
	pcm   []int16
	out   []byte
	phase int

	mu        sync.Mutex
	voice     int       // what the next frames carry
	left      int       // voiced frames left before silence
	segStart  time.Time // the current voice segment's first frame sent; zero until then
	segEnd    time.Time // the latest voiced frame sent
	replies   []heard   // reply audio received, in arrival order
	undecoded int       // received frames that did not decode
	changed   chan struct{}
	frameDur  time.Duration // the sender's frame interval
}

// heard is one frame of reply audio.
type heard struct {
	at  time.Time
	dur time.Duration
}

func newTalker(cfg TalkConfig, frame time.Duration) (*talker, error) {
	config.Default(&cfg.Turns, 2)
	config.Default(&cfg.Speech, time.Second)
	config.Default(&cfg.BargeInAfter, 300*time.Millisecond)
	config.Default(&cfg.ReplyTimeout, 10*time.Second)
	if cfg.Turns < 0 || cfg.Speech < 0 || cfg.BargeInAfter < 0 || cfg.ReplyTimeout < 0 {
		return nil, fmt.Errorf("probe: negative turns, speech, barge-in delay or reply timeout")
	}
	if frame != 20*time.Millisecond {
		return nil, fmt.Errorf("probe: a talker sends 20 ms Opus frames, not %v", frame)
	}
	enc, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		return nil, fmt.Errorf("probe: talker: %w", err)
	}
	dec, err := opus.NewDecoder(talkRate)
	if err != nil {
		enc.Close()
		return nil, fmt.Errorf("probe: talker: %w", err)
	}
	return &talker{cfg: cfg, enc: enc, dec: dec, pcm: make([]int16, enc.FrameSamples()), out: make([]byte, opus.MaxPacket),
		changed: make(chan struct{}, 1), frameDur: frame}, nil
}

func (t *talker) notify() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// frame is the sender's next Opus frame, sent at now.
func (t *talker) frame(now time.Time) ([]byte, error) {
	t.mu.Lock()
	v := t.voice
	if v != voiceSilence {
		if t.left == 0 {
			v, t.voice = voiceSilence, voiceSilence
			t.notify()
		} else {
			t.left--
			if t.segStart.IsZero() {
				t.segStart = now
				t.notify()
			}
			t.segEnd = now
		}
	}
	t.mu.Unlock()
	hz := 0.0
	switch v {
	case voiceTurn:
		hz = TurnHz
	case voiceBargeIn:
		hz = BargeInHz
	}
	for i := range t.pcm {
		if hz == 0 {
			t.pcm[i] = 0
			continue
		}
		t.pcm[i] = int16(toneAmp * 32767 * math.Sin(2*math.Pi*hz*float64(t.phase+i)/48000))
	}
	t.phase += len(t.pcm)
	n, err := t.enc.Encode(t.pcm, t.out)
	if err != nil {
		return nil, err
	}
	return t.out[:n], nil
}

// say makes the sender send voice for d from its next frame on, and
// returns when the previous voiced frame was sent.
func (t *talker) say(voice int, d time.Duration) (prevEnd time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	prevEnd = t.segEnd
	t.voice, t.left, t.segStart = voice, int(d/t.frameDur), time.Time{}
	return prevEnd
}

// heardFrame decodes one received payload; a frame of the turns' tone is
// reply audio. The reader goroutine calls it.
func (t *talker) heardFrame(payload []byte, at time.Time, buf []int16) {
	n, err := t.dec.Decode(payload, buf)
	if err != nil {
		t.mu.Lock()
		t.undecoded++
		t.mu.Unlock()
		return
	}
	pcm := buf[:n]
	if audiotest.RMS(pcm) < voicedRMS || audiotest.Goertzel(pcm, talkRate, TurnHz) <= audiotest.Goertzel(pcm, talkRate, BargeInHz) {
		return
	}
	t.mu.Lock()
	t.replies = append(t.replies, heard{at: at, dur: time.Duration(n) * time.Second / talkRate})
	t.notify()
	t.mu.Unlock()
}

// readTalk feeds the talker what arrives on tr until the track ends.
func (c *Call) readTalk(tr *webrtc.TrackRemote) {
	defer c.talker.dec.Close()
	buf := make([]byte, 1500)
	pcm := make([]int16, talkRate*120/1000)
	var pkt rtp.Packet
	for {
		n, _, err := tr.Read(buf)
		if err != nil {
			return
		}
		if pkt.Unmarshal(buf[:n]) != nil || len(pkt.Payload) == 0 {
			continue
		}
		c.talker.heardFrame(pkt.Payload, time.Now(), pcm)
	}
}

// await waits until cond (called with mu held) holds, the deadline passes
// or ctx ends; it reports whether cond held.
func (t *talker) await(ctx context.Context, deadline time.Time, cond func() bool) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		t.mu.Lock()
		ok := cond()
		t.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-t.changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// sleepUntil waits for the deadline or ctx; false when ctx ended.
func sleepUntil(ctx context.Context, deadline time.Time) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// speak sends voice for d and waits until its last frame is sent; it
// returns the first and last voiced frames' send times.
func (t *talker) speak(ctx context.Context, voice int, d time.Duration) (start, end time.Time, err error) {
	t.say(voice, d)
	if !t.await(ctx, time.Now().Add(d+senderSlack), func() bool { return t.voice == voiceSilence && !t.segStart.IsZero() }) {
		return start, end, waitErr(ctx, "speaking a turn")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.segStart, t.segEnd, nil
}

// waitErr is the error of a talker's wait that did not see its condition:
// ctx's, or its own time running out.
func waitErr(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("talker: %s: %w", what, err)
	}
	return fmt.Errorf("talker: %s: timed out", what)
}

// firstReplyAfter waits for the first reply frame that arrived after from.
func (t *talker) firstReplyAfter(ctx context.Context, from, deadline time.Time) (time.Time, bool) {
	var first time.Time
	ok := t.await(ctx, deadline, func() bool {
		for i := len(t.replies) - 1; i >= 0 && t.replies[i].at.After(from); i-- {
			first = t.replies[i].at
		}
		return !first.IsZero()
	})
	return first, ok
}

// replyEnd waits until no reply audio has arrived for replyQuiet since
// the later of since and the last reply frame (bounded by maxReply after
// since), and returns the last reply frame's arrival (since if none).
func (t *talker) replyEnd(ctx context.Context, since time.Time) (time.Time, error) {
	limit := since.Add(maxReply)
	for {
		t.mu.Lock()
		last := since
		if n := len(t.replies); n > 0 && t.replies[n-1].at.After(last) {
			last = t.replies[n-1].at
		}
		t.mu.Unlock()
		quietAt := last.Add(replyQuiet)
		if !time.Now().Before(quietAt) {
			return last, nil
		}
		if quietAt.After(limit) {
			return last, fmt.Errorf("reply still arriving %v after it began", maxReply)
		}
		if !sleepUntil(ctx, quietAt) {
			return last, ctx.Err()
		}
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// replyAudio sums the reply audio that arrived after from.
func (t *talker) replyAudio(from time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var d time.Duration
	for i := len(t.replies) - 1; i >= 0 && t.replies[i].at.After(from); i-- {
		d += t.replies[i].dur
	}
	return d
}

// talk runs the turn script: lead-in silence, cfg.Turns plain turns (talk,
// wait for the reply and its end), then the barge-in turn (talk for
// twice as long, hear BargeInAfter of the reply, talk over it with the
// barge-in tone and wait until the reply stops).
func (t *talker) talk(ctx context.Context) ([]Turn, error) {
	if !sleepUntil(ctx, time.Now().Add(leadIn)) {
		return nil, ctx.Err()
	}
	var turns []Turn
	for i := 0; i < t.cfg.Turns; i++ {
		start, end, err := t.speak(ctx, voiceTurn, t.cfg.Speech)
		if err != nil {
			return turns, err
		}
		turn := Turn{SpeechMs: ms(end.Sub(start) + t.frameDur)}
		first, ok := t.firstReplyAfter(ctx, start, end.Add(t.cfg.ReplyTimeout))
		if ctx.Err() != nil {
			return turns, ctx.Err()
		}
		if ok {
			turn.Replied, turn.ReplyDelayMs = true, ms(first.Sub(end))
			// A reply that began during the speech (the echo's) has
			// not ended before the speech did.
			if _, err := t.replyEnd(ctx, latest(first, end)); err != nil {
				return turns, err
			}
		}
		turn.ReplyMs = ms(t.replyAudio(start))
		turns = append(turns, turn)
	}

	// The barge-in turn.
	speech := 2 * t.cfg.Speech
	t.say(voiceTurn, speech)
	if !t.await(ctx, time.Now().Add(senderSlack), func() bool { return !t.segStart.IsZero() }) {
		return turns, waitErr(ctx, "starting the barge-in turn")
	}
	t.mu.Lock()
	start := t.segStart
	t.mu.Unlock()
	// The reply may begin while the talker speaks (the echo's does).
	first, ok := t.firstReplyAfter(ctx, start, start.Add(speech+t.cfg.ReplyTimeout))
	turn := Turn{BargeIn: true}
	if !ok {
		if ctx.Err() != nil {
			return turns, ctx.Err()
		}
		t.mu.Lock()
		turn.SpeechMs = ms(t.segEnd.Sub(start) + t.frameDur)
		t.mu.Unlock()
		return append(turns, turn), nil
	}
	if !sleepUntil(ctx, first.Add(t.cfg.BargeInAfter)) {
		return turns, ctx.Err()
	}
	end := t.say(voiceBargeIn, t.cfg.Speech)
	turn.Replied, turn.SpeechMs, turn.ReplyDelayMs = true, ms(end.Sub(start)+t.frameDur), ms(first.Sub(end))
	if !t.await(ctx, time.Now().Add(senderSlack), func() bool { return !t.segStart.IsZero() }) {
		return turns, waitErr(ctx, "talking over the reply")
	}
	t.mu.Lock()
	onset := t.segStart
	t.mu.Unlock()
	last, err := t.replyEnd(ctx, onset)
	if err != nil {
		return turns, err
	}
	turn.BargeInStopMs = ms(last.Sub(onset))
	turn.ReplyMs = ms(t.replyAudio(start))
	// Let the barge-in end before the call does.
	if !t.await(ctx, time.Now().Add(t.cfg.Speech+senderSlack), func() bool { return t.voice == voiceSilence }) {
		return turns, waitErr(ctx, "finishing the barge-in")
	}
	return append(turns, turn), nil
}

// sendTalk sends the talker's next frame as packet seq.
func (c *Call) sendTalk(pkt *rtp.Packet, seq, samples uint32) error {
	payload, err := c.talker.frame(time.Now())
	if err != nil {
		return err
	}
	pkt.SequenceNumber = uint16(seq)
	pkt.Timestamp = seq * samples
	pkt.Payload = payload
	if err := c.out.WriteRTP(pkt); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		return err
	}
	return nil
}

// ErrNoReply is a talker's call (inside a CallError of StageTurns) in
// which no turn heard reply audio.
var ErrNoReply = errors.New("no reply audio in any turn")

// talkCall runs a talker's turns on c, reports and hangs up.
func talkCall(ctx context.Context, c *Call) (callResult, error) {
	var res callResult
	upAt := time.Now()
	// The backend is up when its first event arrives (the echo's answer
	// to ours, a model's session.created): audio before that may be lost.
	var eventRTT time.Duration
	if err := c.SendEvent([]byte(`{"type":"rtcedge.probe"}`)); err != nil {
		return res, &CallError{Stage: StageTurns, Err: fmt.Errorf("send event: %w", err)}
	}
	timer := time.NewTimer(c.talker.cfg.ReplyTimeout)
	select {
	case <-c.Events():
		eventRTT = time.Since(upAt)
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	turns, err := c.talker.talk(ctx)
	res.Timings = c.Timings()
	tm := res.Timings
	res.Report = Report{
		Region: c.Region, Cluster: c.Cluster, POP: c.POP,
		SignalingMs: ms(tm.Signaling), ICEMs: ms(tm.ICEConnected), DTLSMs: ms(tm.DTLSConnected),
		EventReplyMs: ms(eventRTT), DurationSecs: time.Since(upAt).Seconds(), Turns: turns,
	}
	c.talker.mu.Lock()
	res.Report.Undecoded = c.talker.undecoded
	c.talker.mu.Unlock()
	if res.Report.Turns == nil {
		res.Report.Turns = []Turn{}
	}
	if err == nil && !slices.ContainsFunc(turns, func(t Turn) bool { return t.Replied }) {
		err = ErrNoReply
	}
	if err != nil {
		_ = hangup(ctx, c) // free the session; the talker's error is the one to report
		return res, &CallError{Stage: StageTurns, Err: err}
	}
	return res, hangup(ctx, c)
}

// writeTurns renders a talker's turns.
func writeTurns(b *strings.Builder, turns []Turn) {
	for i, t := range turns {
		label := fmt.Sprintf("turn %d", i+1)
		if t.BargeIn {
			label = "barge-in"
		}
		if !t.Replied {
			fmt.Fprintf(b, "%-9s talked %.0f ms, no reply\n", label+":", t.SpeechMs)
			continue
		}
		fmt.Fprintf(b, "%-9s talked %.0f ms, reply after %.1f ms, %.0f ms of reply", label+":", t.SpeechMs, t.ReplyDelayMs, t.ReplyMs)
		if t.BargeIn {
			fmt.Fprintf(b, ", stopped %.1f ms after the barge-in", t.BargeInStopMs)
		}
		b.WriteString("\n")
	}
}

// TurnSummary is a one-line summary of a talker's turns: the median reply
// delay of its replied turns, and the barge-in's stop.
func TurnSummary(turns []Turn) string {
	var delays []float64
	var b strings.Builder
	for _, t := range turns {
		if t.Replied {
			delays = append(delays, t.ReplyDelayMs)
		}
	}
	fmt.Fprintf(&b, "turns %d, replied %d", len(turns), len(delays))
	if len(delays) > 0 {
		slices.Sort(delays)
		fmt.Fprintf(&b, ", reply delay p50 %.1f ms", delays[(len(delays)-1)/2])
	}
	for _, t := range turns {
		if t.BargeIn && t.Replied {
			fmt.Fprintf(&b, ", barge-in stop %.1f ms", t.BargeInStopMs)
		}
	}
	return b.String()
}
