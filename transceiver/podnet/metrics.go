package podnet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/metric"
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
	// dropSRTP: SRTP or SRTCP of a session on the media path that does not
	// authenticate, is a replay, or is malformed.
	dropSRTP
	// dropSSRC: SRTP or SRTCP of a session on the media path from an SSRC
	// past the session's first maxClientSSRCs.
	dropSSRC
	// dropEventBacklog: an event toward a client whose events channel
	// holds too many unread bytes (the session layer's, EventDropped).
	dropEventBacklog
	// dropAmplification: a STUN message (an answer or a probe) toward a
	// client address not proven for the session sending it, refused
	// because it would take the bytes sent there past ampFactor times the
	// bytes received from it (route.go).
	dropAmplification
	// dropRTPToken: a datagram from a phone call's negotiated media
	// address whose header names another routing token than the call's
	// (rtp.go).
	dropRTPToken
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
	dropAmplification: "amplification_limit", dropRTPToken: "rtp_token",
}

// Causes of a session's path change, the "cause" label of
// rtcedge_transceiver_path_change_gap_seconds.
const (
	CauseAddress    = "address"     // the client's address changed behind the same POP (NAT rebinding)
	CausePOP        = "pop"         // the client moved to another POP
	causeICERestart = "ice_restart" // the client restarted ICE (PATCH with new credentials)
)

// Metrics are the packet layer's metrics. The session layer registers
// them (Collectors) next to its own.
type Metrics struct {
	dropVec       *prometheus.CounterVec
	drops         *udpio.Drops[dropReason]
	encapDrops    *udpio.Drops[encap.Reason]
	packetsIn     prometheus.Counter
	packetsOut    prometheus.Counter
	bytesIn       prometheus.Counter
	bytesOut      prometheus.Counter
	writeErrors   prometheus.Counter
	routes        prometheus.Gauge
	reachProbes   prometheus.Counter
	reachProven   prometheus.Counter
	unprovenBytes prometheus.Counter
	followRetries prometheus.Counter
	mediaProbes   prometheus.Counter
	mediaFollows  prometheus.Counter
	gap           *prometheus.HistogramVec
	reportsSent   prometheus.Counter
	clientRTT     prometheus.Histogram
	quality       quality
}

// NewMetrics makes the packet layer's metrics, unregistered.
func NewMetrics() *Metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "rtcedge_transceiver_" + name, Help: help})
	}
	m := &Metrics{
		dropVec:     metric.CounterVec("rtcedge_transceiver_dropped_packets_total", "Datagrams on the pod socket dropped before reaching WebRTC, by reason.", "reason"),
		packetsIn:   counter("packets_in_total", "Client datagrams received from cluster relays and handed to WebRTC."),
		packetsOut:  counter("packets_out_total", "Datagrams sent toward clients through cluster relays."),
		bytesIn:     counter("bytes_in_total", "Client payload bytes received (without the encapsulation header)."),
		bytesOut:    counter("bytes_out_total", "Payload bytes sent toward clients (without the encapsulation header)."),
		writeErrors: counter("socket_write_errors_total", "Failed sends on the pod socket."),
		reachProbes: counter("reach_probes_total", "Binding Requests the pod sent to a client address after its first authenticated check, to prove the address before DTLS goes there."),
		reachProven: counter("reach_proven_total", "Client addresses proven by the answer to the pod's probe."),
		unprovenBytes: counter("unproven_bytes_sent_total", "Payload bytes sent toward client addresses not proven for the session sending them (STUN answers, probes, "+
			"DTLS before the proof): at most 3 times the bytes received from each such address (anti-amplification, RFC 9000 section 8)."),
		routes: metric.Gauge("rtcedge_transceiver_client_routes", "Client return routes (client address per POP) currently remembered."),
		followRetries: counter("follow_retries_total", "Authenticated checks from a new path presented to ICE again once the old address had gone silent "+
			"(they had arrived while it was still live)."),
		mediaProbes: counter("media_probes_total", "Probes (STUN requests signed with the client's password) sent to a new client address because the session's audio "+
			"arrived from it while the selected address was silent: a NAT rebinding seen before the client's next check."),
		mediaFollows: counter("media_follows_total", "Checks presented to ICE for a new client address after it answered such a probe (the hook then decides whether the path moves)."),
		gap: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_transceiver_path_change_gap_seconds",
			Help: "Media gap a path change cost a session: for an address or POP change, the time since the old address " +
				"last delivered a packet; for an ICE restart, the time from the restart to the first check on the new credentials.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10, 20},
		}, []string{"cause"}),
		reportsSent: counter("rtcp_reports_total", "RTCP sender and receiver reports the pod's media path sent to clients."),
		clientRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rtcedge_transceiver_client_rtt_seconds",
			Help:    "Round trip between the pod and its clients, from the clients' RTCP reports on the pod's audio (RFC 3550 LSR/DLSR).",
			Buckets: []float64{.005, .01, .02, .03, .05, .075, .1, .15, .2, .3, .5, 1, 2},
		}),
	}
	m.quality = newQuality()
	for _, c := range []string{CauseAddress, CausePOP, causeICERestart} {
		m.gap.WithLabelValues(c)
	}
	m.drops = udpio.NewDrops[dropReason](m.dropVec, "", dropLabels[:]...)
	m.encapDrops = udpio.NewDrops[encap.Reason](m.dropVec, "encap_", encap.Reasons[:]...)
	return m
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{m.dropVec, m.packetsIn, m.packetsOut, m.bytesIn, m.bytesOut, m.writeErrors, m.routes,
		m.reachProbes, m.reachProven, m.unprovenBytes, m.followRetries, m.mediaProbes, m.mediaFollows, m.gap, m.reportsSent, m.clientRTT},
		m.quality.collectors()...)
}

func (m *Metrics) drop(r dropReason) { m.drops.Inc(r) }

// in counts a client datagram handed on, of n payload bytes.
func (m *Metrics) in(n int) {
	m.packetsIn.Inc()
	m.bytesIn.Add(float64(n))
}

// EventDropped counts an event dropped toward a client that reads none,
// on the pod's drop counter.
func (m *Metrics) EventDropped() { m.drop(dropEventBacklog) }

// ObserveGap records the media gap a session's path change cost (cause:
// CauseAddress or CausePOP).
func (m *Metrics) ObserveGap(cause string, d time.Duration) {
	m.gap.WithLabelValues(cause).Observe(d.Seconds())
}
