package transceiver

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// dropReason is a drop reason of datagrams on the pod socket. It indexes
// counters resolved at start-up (all at zero, so a dashboard sees a flat
// line rather than a missing series): a drop costs one slice index, no
// label lookup. A header decode failure is counted as "encap_<reason>".
type dropReason uint8

const (
	dropOther dropReason = iota
	dropDirection
	dropWrongPod
	dropEmpty
	dropUnknownPOP
	// dropSessionQueue: the session's own queue (sessionQueueLen) is full,
	// its ICE reader has stalled for a second's worth of its datagrams.
	dropSessionQueue
	// dropUnknownClient: from a client address no session of the POP
	// knows, and not a STUN Binding Request naming one of its ufrags.
	dropUnknownClient
	dropNoRoute
	dropOversize
	dropRouteTable
	dropUnknownRelay
	dropProvisional
	dropProvisionalEvicted
	dropHeldOverflow
	dropHeldExpired
	// dropSRTP: SRTP or SRTCP of a session on the pod's media path that
	// does not authenticate, is a replay, or is malformed (media.go).
	dropSRTP
	// dropSSRC: SRTP or SRTCP of a session on the pod's media path from
	// an SSRC past the session's first maxClientSSRCs (media.go).
	dropSSRC
	// dropEventBacklog: an event toward a client whose events channel
	// holds maxEventBacklog unread bytes (session.go).
	dropEventBacklog
	numDropReasons
)

// dropLabels is the "reason" label of every dropReason, indexed by it.
var dropLabels = [numDropReasons]string{
	dropOther: "other", dropDirection: "wrong_direction", dropWrongPod: "wrong_pod", dropEmpty: "empty",
	dropUnknownPOP: "unknown_pop", dropSessionQueue: "session_queue_full", dropUnknownClient: "unknown_client", dropNoRoute: "no_route", dropOversize: "oversize",
	dropRouteTable: "route_table_full", dropUnknownRelay: "unknown_relay",
	dropProvisional: "route_provisional", dropProvisionalEvicted: "provisional_evicted",
	dropHeldOverflow: "held_overflow", dropHeldExpired: "held_expired", dropSRTP: "srtp",
	dropSSRC: "ssrc", dropEventBacklog: "event_backlog",
}

// String returns the reason's label.
func (r dropReason) String() string { return dropLabels[r] }

// Session end reasons, the "reason" label of sessions_ended_total.
const (
	endDeleted        = "deleted"
	endConnectTimeout = "connect_timeout"
	endICEFailed      = "ice_failed"
	endIdle           = "idle"
	endShutdown       = "shutdown"
	endDrainDeadline  = "drain_deadline"
	endRemoteClosed   = "closed"
	endBackend        = "backend_closed"
)

type metrics struct {
	dropVec      *prometheus.CounterVec
	drops        *udpio.Drops[dropReason]
	encapDrops   *udpio.Drops[encap.Reason]
	packetsIn    prometheus.Counter
	packetsOut   prometheus.Counter
	bytesIn      prometheus.Counter
	bytesOut     prometheus.Counter
	writeErrors  prometheus.Counter
	sessions     prometheus.Gauge
	created      prometheus.Counter
	rejected     *prometheus.CounterVec
	ended        *prometheus.CounterVec
	setupSeconds prometheus.Histogram
	routes       prometheus.Gauge
	popSwitches  prometheus.Counter
	reachProbes  prometheus.Counter
	reachProven  prometheus.Counter
	earlySelects prometheus.Counter
	path         *pathMetrics // address changes, ICE restarts (pathmetrics.go)
	mediaPaths   *prometheus.CounterVec
	reportsSent  prometheus.Counter
	clientRTT    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		path: newPathMetrics(),
		dropVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_dropped_packets_total",
			Help: "Datagrams on the pod socket dropped before reaching WebRTC, by reason.",
		}, []string{"reason"}),
		packetsIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_packets_in_total",
			Help: "Client datagrams received from cluster relays and handed to WebRTC.",
		}),
		packetsOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_packets_out_total",
			Help: "Datagrams sent toward clients through cluster relays.",
		}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_bytes_in_total",
			Help: "Client payload bytes received (without the encapsulation header).",
		}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_bytes_out_total",
			Help: "Payload bytes sent toward clients (without the encapsulation header).",
		}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_socket_write_errors_total",
			Help: "Failed sends on the pod socket.",
		}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rtcedge_transceiver_sessions",
			Help: "Sessions currently held by this pod (connecting or connected).",
		}),
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_sessions_created_total",
			Help: "Sessions created (answers returned).",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_sessions_rejected_total",
			Help: "Session requests refused, by reason.",
		}, []string{"reason"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_sessions_ended_total",
			Help: "Sessions ended, by reason.",
		}, []string{"reason"}),
		setupSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rtcedge_transceiver_setup_seconds",
			Help:    "Time from the session request to DTLS connected, as seen by the pod.",
			Buckets: []float64{.01, .025, .05, .1, .15, .2, .3, .5, .75, 1, 2, 5, 10},
		}),
		popSwitches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_pop_switches_total",
			Help: "Sessions whose selected pair moved to another POP: the transceiver followed checks through another POP after the selected one went silent, or the client nominated a pair through another POP.",
		}),
		earlySelects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_early_selects_total",
			Help: "Sessions whose preferred POP pair was selected on the first check, before the client nominated.",
		}),
		reachProbes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_reach_probes_total",
			Help: "Binding Requests the pod sent to a client address after its first authenticated check, to prove the address before DTLS goes there.",
		}),
		reachProven: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_reach_proven_total",
			Help: "Client addresses proven by the answer to the pod's probe.",
		}),
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rtcedge_transceiver_client_routes",
			Help: "Client return routes (client address per POP) currently remembered.",
		}),
		mediaPaths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_media_paths_total",
			Help: "Connected sessions by the path their SRTP takes: pod (decrypted on the socket's readers, media.go) or pion (the pod's path could not start; see the log).",
		}, []string{"path"}),
		reportsSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_transceiver_rtcp_reports_total",
			Help: "RTCP sender and receiver reports the pod's media path sent to clients.",
		}),
		clientRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rtcedge_transceiver_client_rtt_seconds",
			Help:    "Round trip between the pod and its clients, from the clients' RTCP reports on the pod's audio (RFC 3550 LSR/DLSR).",
			Buckets: []float64{.005, .01, .02, .03, .05, .075, .1, .15, .2, .3, .5, 1, 2},
		}),
	}
	for _, p := range []string{"pod", "pion"} {
		m.mediaPaths.WithLabelValues(p)
	}
	m.drops = udpio.NewDrops[dropReason](m.dropVec, "", dropLabels[:]...)
	m.encapDrops = udpio.NewDrops[encap.Reason](m.dropVec, "encap_", encap.Reasons[:]...)
	for _, r := range []string{rejectDraining, rejectFull, rejectBadOffer, rejectBadPOP, rejectInternal, rejectBackend} {
		m.rejected.WithLabelValues(r)
	}
	for _, r := range []string{endDeleted, endConnectTimeout, endICEFailed, endIdle, endShutdown, endDrainDeadline, endRemoteClosed, endBackend} {
		m.ended.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range append([]prometheus.Collector{m.dropVec, m.packetsIn, m.packetsOut, m.bytesIn, m.bytesOut,
		m.writeErrors, m.sessions, m.created, m.rejected, m.ended, m.setupSeconds, m.routes, m.popSwitches, m.earlySelects,
		m.reachProbes, m.reachProven, m.mediaPaths, m.reportsSent, m.clientRTT}, m.path.collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register transceiver metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) drop(r dropReason) { m.drops.Inc(r) }
