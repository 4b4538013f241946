package probe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/metric"
)

// Metrics are the continuous prober's Prometheus series. Placement labels
// (region, pop, cluster) come from signaling's X-Rtcedge-* answer headers,
// so one prober pointed at a global signaling URL shows which region and
// POP it was sent to, and how that performed.
type Metrics struct {
	setup       *prometheus.HistogramVec // stage, region, pop, cluster
	rtt         *prometheus.HistogramVec // region, pop, cluster
	jitter      *prometheus.GaugeVec     // region, pop, cluster
	loss        *prometheus.GaugeVec     // region, pop, cluster
	turnDelay   *prometheus.HistogramVec // region, pop, cluster
	bargeInStop *prometheus.HistogramVec // region, pop, cluster
	runs        *prometheus.CounterVec   // result
	failures    *prometheus.CounterVec   // reason
	lastSuccess prometheus.Gauge
}

var placementLabels = []string{"region", "pop", "cluster"}

// NewMetrics registers the probe's metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		setup: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_probe_setup_seconds",
			Help: "Time from posting the offer until each setup stage completed (signaling answer, ICE connected, DTLS connected, first echoed audio).",
			// 5 ms to 20 s: loopback calls set up in tens of ms, a lossy
			// intercontinental one in seconds.
			Buckets: []float64{.005, .01, .02, .05, .1, .2, .35, .5, .75, 1, 1.5, 2, 3, 5, 10, 20},
		}, append([]string{"stage"}, placementLabels...)),
		rtt: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rtcedge_probe_rtt_seconds",
			Help:    "Round-trip time of each echoed audio packet (client → edge → echo backend → client).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .15, .2, .3, .5, 1},
		}, placementLabels),
		jitter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtcedge_probe_jitter_seconds",
			Help: "Smoothed RTT variation (RFC 3550 style) of the latest probe call.",
		}, placementLabels),
		loss: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtcedge_probe_loss_ratio",
			Help: "Share of audio packets of the latest probe call that were not echoed within a second.",
		}, placementLabels),
		turnDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_probe_turn_reply_delay_seconds",
			Help: "A talker's turns (probe -turns): from the end of its speech to the first reply audio it received (0 when the reply began during the speech).",
			// A model answers in hundreds of ms to seconds.
			Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10},
		}, placementLabels),
		bargeInStop: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rtcedge_probe_bargein_stop_seconds",
			Help:    "A talker's barge-in turns: from its first frame over the reply to the last reply audio it received.",
			Buckets: []float64{.02, .05, .1, .15, .2, .3, .5, .75, 1, 2, 5},
		}, placementLabels),
		runs:        metric.CounterVec("rtcedge_probe_runs_total", "Probe calls by result (ok or error).", "result"),
		failures:    metric.CounterVec("rtcedge_probe_failures_total", "Failed probe calls by reason (<stage>_http_<status>, <stage>_timeout, <stage>_failed, <stage>_error, canceled).", "reason"),
		lastSuccess: metric.Gauge("rtcedge_probe_last_success_timestamp_seconds", "Unix time of the end of the latest successful probe call; alert on its age."),
	}
	for _, c := range []prometheus.Collector{m.setup, m.rtt, m.jitter, m.loss, m.turnDelay, m.bargeInStop, m.runs, m.failures, m.lastSuccess} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("probe: register metrics: %w", err)
		}
	}
	// Both results exist from the start, so a rate() over them works
	// before the first failure.
	m.runs.WithLabelValues("ok")
	m.runs.WithLabelValues("error")
	return m, nil
}

// observe records one call.
func (m *Metrics) observe(res callResult, err error) {
	r := res.Report
	if err != nil {
		m.runs.WithLabelValues("error").Inc()
		m.failures.WithLabelValues(FailureReason(err)).Inc()
		return
	}
	m.runs.WithLabelValues("ok").Inc()
	m.lastSuccess.SetToCurrentTime()
	if r.Turns != nil {
		m.observeTurns(r)
		return
	}
	tm := res.Timings
	for _, s := range []struct {
		stage string
		d     time.Duration
	}{{StageSignaling, tm.Signaling}, {StageICE, tm.ICEConnected}, {StageDTLS, tm.DTLSConnected}, {StageFirstEcho, tm.FirstEcho}} {
		m.setup.WithLabelValues(s.stage, r.Region, r.POP, r.Cluster).Observe(s.d.Seconds())
	}
	h := m.rtt.WithLabelValues(r.Region, r.POP, r.Cluster)
	for _, d := range res.Audio.RTTs {
		h.Observe(d.Seconds())
	}
	m.jitter.WithLabelValues(r.Region, r.POP, r.Cluster).Set(res.Audio.Jitter.Seconds())
	m.loss.WithLabelValues(r.Region, r.POP, r.Cluster).Set(res.Audio.LossRatio())
}

// observeTurns records a talker's call: its connection stages and turns.
func (m *Metrics) observeTurns(r Report) {
	for _, s := range []struct {
		stage string
		ms    float64
	}{{StageSignaling, r.SignalingMs}, {StageICE, r.ICEMs}, {StageDTLS, r.DTLSMs}} {
		m.setup.WithLabelValues(s.stage, r.Region, r.POP, r.Cluster).Observe(s.ms / 1000)
	}
	delay, stop := m.turnDelay.WithLabelValues(r.Region, r.POP, r.Cluster), m.bargeInStop.WithLabelValues(r.Region, r.POP, r.Cluster)
	for _, t := range r.Turns {
		if !t.Replied {
			continue
		}
		delay.Observe(max(0, t.ReplyDelayMs) / 1000)
		if t.BargeIn {
			stop.Observe(t.BargeInStopMs / 1000)
		}
	}
}

// ContinuousConfig configures a continuous prober.
type ContinuousConfig struct {
	Call Config
	// Interval is the time between the starts of consecutive calls;
	// default 30s. A call that outlasts it delays the next one.
	Interval time.Duration
	// Hold is how long each call stays up after its first echo; default 5s.
	Hold time.Duration
	// SetupTimeout bounds each call's setup; default DefaultSetupTimeout.
	SetupTimeout time.Duration
	// Iterations stops after that many calls; 0 runs until ctx ends.
	Iterations int
	// Metrics, when set, records every call.
	Metrics *Metrics
	// OnResult, when set, is called after every call, from the prober's
	// goroutine.
	OnResult func(Report, error)
}

// Continuous places a call every Interval until ctx ends (or Iterations
// calls are done) and records each. Failed calls are recorded, not
// returned: Continuous returns nil when it stops, or a config error.
func Continuous(ctx context.Context, cfg ContinuousConfig) error {
	config.Default(&cfg.Interval, 30*time.Second)
	config.Default(&cfg.Hold, 5*time.Second)
	config.Default(&cfg.SetupTimeout, DefaultSetupTimeout)
	if cfg.Interval < 0 || cfg.Hold < 0 || cfg.SetupTimeout < 0 || cfg.Iterations < 0 {
		return errors.New("probe: negative interval, hold, setup timeout or iterations")
	}
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for i := 0; cfg.Iterations == 0 || i < cfg.Iterations; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		res, err := runCall(ctx, cfg.Call, plan{setupTimeout: cfg.SetupTimeout, hold: cfg.Hold})
		if ctx.Err() != nil && err != nil {
			// Interrupted, not failed: stopping must not raise an alert.
			return nil
		}
		if cfg.Metrics != nil {
			cfg.Metrics.observe(res, err)
		}
		if cfg.OnResult != nil {
			cfg.OnResult(res.Report, err)
		}
	}
	return nil
}
