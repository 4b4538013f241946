package probe

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Report is the result of one probe call, in milliseconds for JSON.
type Report struct {
	Region       string  `json:"region"`
	Cluster      string  `json:"cluster"`
	POP          string  `json:"pop"`
	Steering     string  `json:"steering,omitempty"` // why signaling chose the POP
	SignalingMs  float64 `json:"signaling_ms"`
	ICEMs        float64 `json:"ice_connected_ms"`
	DTLSMs       float64 `json:"dtls_connected_ms"`
	FirstEchoMs  float64 `json:"first_echo_ms"`
	RTTP50Ms     float64 `json:"rtt_p50_ms"`
	RTTP90Ms     float64 `json:"rtt_p90_ms"`
	RTTP99Ms     float64 `json:"rtt_p99_ms"`
	JitterMs     float64 `json:"jitter_ms"`
	Sent         int     `json:"packets_sent"`
	Received     int     `json:"packets_received"`
	LossRatio    float64 `json:"loss_ratio"`
	EventReplyMs float64 `json:"event_reply_ms"`
	DurationSecs float64 `json:"duration_s"`
	// Turns are a talker's (Config.Talk), which measures no echo;
	// Undecoded counts the frames it received that did not decode.
	Turns     []Turn `json:"turns,omitempty"`
	Undecoded int    `json:"undecoded_frames,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// DefaultSetupTimeout bounds a call from posting the offer to the first
// echoed audio packet.
const DefaultSetupTimeout = 15 * time.Second

// hangupTimeout bounds the DELETE at the end of a call. It runs even after
// the caller's context ended, so interrupted probes still free their
// sessions on the server.
const hangupTimeout = 5 * time.Second

// eventTimeout bounds the wait for the reply to the probe's one event.
const eventTimeout = 5 * time.Second

// Once places one call, keeps it up for hold after the first echo, sends
// one event, hangs up and reports.
func Once(ctx context.Context, cfg Config, hold time.Duration) (Report, error) {
	res, err := runCall(ctx, cfg, plan{setupTimeout: DefaultSetupTimeout, hold: hold})
	if err != nil {
		return Report{}, err
	}
	return res.Report, nil
}

// plan bounds one call from dial to hang-up.
type plan struct {
	setupTimeout time.Duration // dial through the first echo
	hold         time.Duration // time up after the first echo, unless until is set
	until        time.Time     // when set, hang up at this time instead
	onUp         func(*Call)   // called once the first echo arrived
}

// callResult is everything one call measured. On error it holds what was
// measured before the failure (placement and timings when known).
type callResult struct {
	Report  Report
	Timings Timings
	Audio   AudioStats
}

// runCall places one call according to p. Its errors are CallErrors.
func runCall(ctx context.Context, cfg Config, p plan) (callResult, error) {
	var res callResult
	setupCtx, cancel := context.WithTimeout(ctx, p.setupTimeout)
	defer cancel()
	c, err := Dial(setupCtx, cfg)
	if err != nil {
		return res, err
	}
	defer c.Close()
	res.Report.Region, res.Report.Cluster, res.Report.POP, res.Report.Steering = c.Region, c.Cluster, c.POP, c.Steering
	if c.talker != nil {
		return talkCall(ctx, c)
	}
	if err := c.WaitEcho(setupCtx); err != nil {
		res.Timings = c.Timings()
		return res, err
	}
	upAt := time.Now()
	if p.onUp != nil {
		p.onUp(c)
	}
	var eventRTT time.Duration
	sent := time.Now()
	if err := c.SendEvent([]byte(`{"type":"rtcedge.probe"}`)); err == nil {
		timer := time.NewTimer(eventTimeout)
		select {
		case <-c.Events():
			eventRTT = time.Since(sent)
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
	until := p.until
	if until.IsZero() {
		until = upAt.Add(p.hold)
	}
	if wait := time.Until(until); wait > 0 {
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
	res.Audio = c.Stats()
	res.Timings = c.Timings()
	st, tm := res.Audio, res.Timings
	res.Report = Report{
		Region: c.Region, Cluster: c.Cluster, POP: c.POP, Steering: c.Steering,
		SignalingMs: ms(tm.Signaling), ICEMs: ms(tm.ICEConnected), DTLSMs: ms(tm.DTLSConnected), FirstEchoMs: ms(tm.FirstEcho),
		RTTP50Ms: ms(st.Percentile(50)), RTTP90Ms: ms(st.Percentile(90)), RTTP99Ms: ms(st.Percentile(99)),
		JitterMs: ms(st.Jitter), Sent: st.Sent, Received: st.Received, LossRatio: st.LossRatio(),
		EventReplyMs: ms(eventRTT), DurationSecs: time.Since(upAt).Seconds(),
	}
	return res, hangup(ctx, c)
}

// hangup hangs c up, even after ctx ended; its error is a CallError.
func hangup(ctx context.Context, c *Call) error {
	hctx, hcancel := context.WithTimeout(context.WithoutCancel(ctx), hangupTimeout)
	defer hcancel()
	if err := c.Hangup(hctx); err != nil {
		return &CallError{Stage: StageHangup, Err: err}
	}
	return nil
}

// String renders a human summary.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "placed in region %s, cluster %s, POP %s\n", r.Region, r.Cluster, r.POP)
	if r.Turns != nil {
		fmt.Fprintf(&b, "setup:  signaling %.1f ms, ICE connected %.1f ms, DTLS connected %.1f ms\n", r.SignalingMs, r.ICEMs, r.DTLSMs)
		fmt.Fprintf(&b, "events: first in %.1f ms\n", r.EventReplyMs)
		writeTurns(&b, r.Turns)
		if r.Undecoded > 0 {
			fmt.Fprintf(&b, "audio:  %d frames received did not decode\n", r.Undecoded)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "setup:  signaling %.1f ms, ICE connected %.1f ms, DTLS connected %.1f ms, first echo %.1f ms\n",
		r.SignalingMs, r.ICEMs, r.DTLSMs, r.FirstEchoMs)
	fmt.Fprintf(&b, "audio:  RTT p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, jitter %.2f ms\n", r.RTTP50Ms, r.RTTP90Ms, r.RTTP99Ms, r.JitterMs)
	fmt.Fprintf(&b, "        %d sent, %d echoed, loss %.2f%% over %.0f s\n", r.Sent, r.Received, 100*r.LossRatio, r.DurationSecs)
	fmt.Fprintf(&b, "events: reply in %.1f ms\n", r.EventReplyMs)
	return b.String()
}
