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
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Once places one call, keeps it up for hold after the first echo, sends
// one event, hangs up and reports.
func Once(ctx context.Context, cfg Config, hold time.Duration) (Report, error) {
	setupCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := Dial(setupCtx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer c.Close()
	if err := c.WaitEcho(setupCtx); err != nil {
		return Report{}, err
	}
	var eventRTT time.Duration
	sent := time.Now()
	if err := c.SendEvent([]byte(`{"type":"rtcedge.probe"}`)); err == nil {
		select {
		case <-c.Events():
			eventRTT = time.Since(sent)
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
	}
	select {
	case <-time.After(hold):
	case <-ctx.Done():
	}
	st := c.Stats()
	tm := c.Timings()
	hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer hcancel()
	if err := c.Hangup(hctx); err != nil {
		return Report{}, fmt.Errorf("hang up: %w", err)
	}
	return Report{
		Region: c.Region, Cluster: c.Cluster, POP: c.POP,
		SignalingMs: ms(tm.Signaling), ICEMs: ms(tm.ICEConnected), DTLSMs: ms(tm.DTLSConnected), FirstEchoMs: ms(tm.FirstEcho),
		RTTP50Ms: ms(st.Percentile(50)), RTTP90Ms: ms(st.Percentile(90)), RTTP99Ms: ms(st.Percentile(99)),
		JitterMs: ms(st.Jitter), Sent: st.Sent, Received: st.Received, LossRatio: st.LossRatio(),
		EventReplyMs: ms(eventRTT), DurationSecs: hold.Seconds(),
	}, nil
}

// String renders a human summary.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "placed in region %s, cluster %s, POP %s\n", r.Region, r.Cluster, r.POP)
	fmt.Fprintf(&b, "setup:  signaling %.1f ms, ICE connected %.1f ms, DTLS connected %.1f ms, first echo %.1f ms\n",
		r.SignalingMs, r.ICEMs, r.DTLSMs, r.FirstEchoMs)
	fmt.Fprintf(&b, "audio:  RTT p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, jitter %.2f ms\n", r.RTTP50Ms, r.RTTP90Ms, r.RTTP99Ms, r.JitterMs)
	fmt.Fprintf(&b, "        %d sent, %d echoed, loss %.2f%% over %.0f s\n", r.Sent, r.Received, 100*r.LossRatio, r.DurationSecs)
	fmt.Fprintf(&b, "events: reply in %.1f ms\n", r.EventReplyMs)
	return b.String()
}
