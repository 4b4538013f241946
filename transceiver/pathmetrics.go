package transceiver

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Causes of a session's path change, the "cause" label of
// rtcedge_transceiver_path_change_gap_seconds.
const (
	causeAddress    = "address"     // the client's address changed behind the same POP (NAT rebinding)
	causePOP        = "pop"         // the client moved to another POP
	causeICERestart = "ice_restart" // the client restarted ICE (PATCH with new credentials)
)

// pathMetrics counts how sessions follow their clients across address
// changes and ICE restarts, and what each cost.
type pathMetrics struct {
	addressChanges prometheus.Counter
	followRetries  prometheus.Counter
	mediaProbes    prometheus.Counter
	mediaFollows   prometheus.Counter
	iceRestarts    *prometheus.CounterVec
	gap            *prometheus.HistogramVec
}

// ICE restart outcomes, the "result" label of ice_restarts_total.
const (
	restartOK       = "ok"
	restartBadFrag  = "bad_fragment"
	restartStale    = "precondition_failed"
	restartNotFound = "not_found"
	restartFailed   = "failed"
)

func newPathMetrics() *pathMetrics {
	m := &pathMetrics{
		addressChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_address_changes_total",
			Help: "Sessions whose selected pair moved to a new client address behind the same POP (NAT rebinding, network change), " +
				"whichever side moved it: the transceiver once the old address was silent, or the client by nomination.",
		}),
		followRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_follow_retries_total",
			Help: "Authenticated checks from a new path presented to ICE again once the old address had gone silent " +
				"(they had arrived while it was still live).",
		}),
		mediaProbes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_media_probes_total",
			Help: "Probes (STUN requests signed with the client's password) sent to a new client address because the session's audio " +
				"arrived from it while the selected address was silent: a NAT rebinding seen before the client's next check.",
		}),
		mediaFollows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_media_follows_total",
			Help: "Checks presented to ICE for a new client address after it answered such a probe (the hook then decides whether the path moves).",
		}),
		iceRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_ice_restarts_total",
			Help: "ICE restarts asked for by PATCH of the session resource, by result.",
		}, []string{"result"}),
		gap: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_transceiver_path_change_gap_seconds",
			Help: "Media gap a path change cost a session: for an address or POP change, the time since the old address " +
				"last delivered a packet; for an ICE restart, the time from the restart to the first check on the new credentials.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10, 20},
		}, []string{"cause"}),
	}
	for _, r := range []string{restartOK, restartBadFrag, restartStale, restartNotFound, restartFailed} {
		m.iceRestarts.WithLabelValues(r)
	}
	for _, c := range []string{causeAddress, causePOP, causeICERestart} {
		m.gap.WithLabelValues(c)
	}
	return m
}

func (m *pathMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.addressChanges, m.followRetries, m.mediaProbes, m.mediaFollows, m.iceRestarts, m.gap}
}

func (m *pathMetrics) observeGap(cause string, d time.Duration) {
	m.gap.WithLabelValues(cause).Observe(d.Seconds())
}
