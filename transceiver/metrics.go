package transceiver

// The transceiver's metrics: sessions, drops by reason (every label zeroed
// at start-up), turns and barge-ins, sidebands.

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/transceiver/dtmf"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
)

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
	endRTPTimeout     = "rtp_timeout" // a phone call's carrier sent no RTP for Config.RTPTimeout
)

// What became of a phone call's datagrams, the "result" label of
// rtcedge_transceiver_call_packets_total (rtpcall.go).
const (
	callAudio       = iota // RTP of the call's codec, heard by the backend
	callRTCP               // RTCP (rtcp-mux): not needed, not read
	callDTMF               // RFC 4733 events (rtpdtmf.go)
	callPayloadType        // another payload type than the answer's
	callSSRC               // another SSRC while the call's is live
	callLate               // a duplicate, or overtaken by a later one
	callMalformed          // not RTP
	callCodec              // a frame the codec refused
	callSent               // reply RTP sent to the carrier
	callNoRoute            // reply RTP before the carrier's first datagram
	numCallResults
)

var callResultLabels = [numCallResults]string{callAudio: "audio", callRTCP: "rtcp", callDTMF: "dtmf", callPayloadType: "payload_type",
	callSSRC: "ssrc", callLate: "late", callMalformed: "malformed", callCodec: "codec", callSent: "sent", callNoRoute: "no_route"}

// ICE restart outcomes, the "result" label of ice_restarts_total.
const (
	restartOK       = "ok"
	restartBadFrag  = "bad_fragment"
	restartStale    = "precondition_failed"
	restartNotFound = "not_found"
	restartFailed   = "failed"
)

// Per-call bound drops, the "reason" label of rtcedge_transceiver_dropped_total.
const (
	// dropReplyItem: a call's pacer forgot its oldest reply item to stay
	// within its bound (a backend that begins items and ends none).
	dropReplyItem = "reply_item"
	// dropCallerAudio: a caller frame over the caller's credit of audio
	// (intake.go: 1.5x real time over a second).
	dropCallerAudio = "caller_audio"
)

var dropReasons = []string{dropReplyItem, dropCallerAudio}

// metrics are the session layer's metrics and, registered with them, the
// packet layer's (net).
type metrics struct {
	net            *podnet.Metrics
	sessions       prometheus.Gauge
	created        prometheus.Counter
	rejected       *prometheus.CounterVec
	ended          *prometheus.CounterVec
	setupSeconds   prometheus.Histogram
	popSwitches    prometheus.Counter
	earlySelects   prometheus.Counter
	addressChanges prometheus.Counter
	iceRestarts    *prometheus.CounterVec
	mediaPaths     *prometheus.CounterVec
	// dropped counts what a call's bounds dropped (per-call bounds,
	// docs/operations.md), by reason.
	droppedVec *prometheus.CounterVec
	dropped    map[string]prometheus.Counter // droppedVec's children, resolved once for the media path
	// Phone calls (rtpcall.go).
	calls       prometheus.Counter
	passCalls   prometheus.Counter // of calls: G.711 passthrough (rtppass.go)
	callPackets [numCallResults]prometheus.Counter
	callPktVec  *prometheus.CounterVec
	// Phone calls' keypad digits (rtpdtmf.go), by direction and result.
	dtmfIn  [dtmf.NumResults]prometheus.Counter
	dtmfOut [numDTMFOut]prometheus.Counter
	dtmfVec *prometheus.CounterVec

	// Turns (transceiver/pace, docs/backends.md "Paced output and
	// barge-in"): pop is the POP of the session's selected path.
	replyDelay  *prometheus.HistogramVec
	bargeinStop *prometheus.HistogramVec
	replyAudio  *prometheus.CounterVec
	bargeins    *prometheus.CounterVec
	// The sidebands (sideband.go).
	sidebandAttaches *prometheus.CounterVec
	sidebandCloses   *prometheus.CounterVec
	sidebandEvents   *prometheus.CounterVec
	sidebands        prometheus.Gauge
}

// Reply audio states, the "state" label of rtcedge_reply_audio_seconds_total.
const (
	replyGenerated = "generated"
	replySent      = "sent"
	replyDropped   = "dropped"
)

func newMetrics(reg, turnReg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "rtcedge_transceiver_" + name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_transceiver_" + name, Help: help}, []string{label})
	}
	m := &metrics{
		net:      podnet.NewMetrics(),
		sessions: metric.Gauge("rtcedge_transceiver_sessions", "Sessions currently held by this pod (connecting or connected)."),
		created:  counter("sessions_created_total", "Sessions created (answers returned)."),
		rejected: counterVec("sessions_rejected_total", "Session requests refused, by reason.", "reason"),
		ended:    counterVec("sessions_ended_total", "Sessions ended, by reason.", "reason"),
		setupSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rtcedge_transceiver_setup_seconds",
			Help:    "Time from the session request to DTLS connected, as seen by the pod.",
			Buckets: []float64{.01, .025, .05, .1, .15, .2, .3, .5, .75, 1, 2, 5, 10},
		}),
		popSwitches:    counter("pop_switches_total", "Sessions whose selected pair moved to another POP: the transceiver followed checks through another POP after the selected one went silent, or the client nominated a pair through another POP."),
		earlySelects:   counter("early_selects_total", "Sessions whose preferred POP pair was selected on the first check, before the client nominated."),
		addressChanges: counter("address_changes_total", "Sessions whose selected pair moved to a new client address behind the same POP (NAT rebinding, network change), whichever side moved it: the transceiver once the old address was silent, or the client by nomination."),
		iceRestarts:    counterVec("ice_restarts_total", "ICE restarts asked for by PATCH of the session resource, by result.", "result"),
		droppedVec:     counterVec("dropped_total", "What a call's bounds dropped, by reason: reply_item (a reply item its pacer stopped tracking: a backend that begins items and ends no response), caller_audio (caller frames over 1.5x real time).", "reason"),
		mediaPaths:     counterVec("media_paths_total", "Connected sessions by the path their SRTP takes: pod (decrypted on the socket's readers, podnet.Media) or pion (the pod's path could not start; see the log).", "path"),
	}
	m.calls = counter("calls_created_total", "Phone calls created (session kind rtp; also counted in sessions_created_total).")
	m.passCalls = counter("calls_passthrough_total", "Phone calls whose G.711 went to the backend and back as it came, with no codec on the pod (a backend that takes audio/pcmu or audio/pcma).")
	m.callPktVec = counterVec("call_packets_total", "Phone calls' datagrams by what became of them: audio, rtcp, dtmf (telephone events, counted by what they were in call_dtmf_total), payload_type, ssrc, late, malformed, codec (dropped), and the reply's sent and no_route.", "result")
	for i, l := range callResultLabels {
		m.callPackets[i] = m.callPktVec.WithLabelValues(l)
	}
	m.dtmfVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_transceiver_call_dtmf_total",
		Help: "Phone calls' RFC 4733 telephone events: in, the carrier's packets by what they were (digit: a new digit given to the backend; repeat, malformed, not_digit, stale, rate: dropped); out, the digits asked for (sent, no_route: before the carrier's first RTP, refused: not digits, a full queue or no telephone-event offered)."},
		[]string{"direction", "result"})
	for i, r := range dtmf.Results {
		m.dtmfIn[i] = m.dtmfVec.WithLabelValues("in", r.String())
	}
	for i, l := range dtmfOutLabels {
		m.dtmfOut[i] = m.dtmfVec.WithLabelValues("out", l)
	}
	m.replyDelay = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rtcedge_turn_reply_delay_seconds",
		Help:    "Time from the end of the caller's speech (the backend's speech_stopped, or the edge's VAD) to the first reply frame sent, by the POP of the call's path.",
		Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10}}, []string{"pop"})
	m.bargeinStop = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rtcedge_turn_bargein_stop_seconds",
		Help:    "Time from a barge-in's onset to the last reply frame sent, by the POP of the call's path.",
		Buckets: []float64{0, .005, .01, .02, .03, .04, .06, .08, .1, .15, .2, .5}}, []string{"pop"})
	m.replyAudio = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_reply_audio_seconds_total",
		Help: "Seconds of audio the backends wrote toward callers (generated), the pod sent at real time (sent), and dropped (a barge-in, a full queue)."}, []string{"state"})
	m.bargeins = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_bargeins_total",
		Help: "Replies cleared because the caller spoke over them, by what detected it: backend (its VAD's speech_started), edge (the pod's VAD), client (output_audio_buffer.clear)."}, []string{"source"})
	for _, st := range []string{replyGenerated, replySent, replyDropped} {
		m.replyAudio.WithLabelValues(st)
	}
	for _, src := range []string{backend.ClearBackend, backend.ClearEdge, backend.ClearClient} {
		m.bargeins.WithLabelValues(src)
	}
	m.sidebandAttaches = counterVec("sideband_attaches_total", "Sideband WebSockets asked for at this pod, by result (attached, not_found, too_many, upgrade_failed).", "result")
	m.sidebandCloses = counterVec("sideband_closes_total", "Sidebands closed, by reason: slow (its queue of events filled; the call went on), call_ended, closed (by the app server or its connection), too_many.", "reason")
	m.sidebandEvents = counterVec("sideband_events_total", "Sideband events: to_sideband (the call's events written to a sideband), from_sideband (the app's events handed to the backend), refused (not one strictly read JSON object: the sideband got an error event), dropped (binary messages).", "direction")
	m.sidebands = metric.Gauge("rtcedge_transceiver_sidebands", "Sidebands attached to this pod's calls now.")
	for _, r := range sbAttachResults {
		m.sidebandAttaches.WithLabelValues(r)
	}
	for _, r := range sbCloseReasons {
		m.sidebandCloses.WithLabelValues(r)
	}
	for _, d := range []string{"to_sideband", "from_sideband", "refused", "dropped"} {
		m.sidebandEvents.WithLabelValues(d)
	}
	m.dropped = map[string]prometheus.Counter{}
	for _, r := range dropReasons {
		m.dropped[r] = m.droppedVec.WithLabelValues(r)
	}
	for _, p := range []string{"pod", "pion"} {
		m.mediaPaths.WithLabelValues(p)
	}
	for _, r := range []string{restartOK, restartBadFrag, restartStale, restartNotFound, restartFailed} {
		m.iceRestarts.WithLabelValues(r)
	}
	for _, r := range []string{rejectDraining, rejectFull, rejectBadOffer, rejectBadPOP, rejectInternal, rejectBackend} {
		m.rejected.WithLabelValues(r)
	}
	for _, r := range []string{endDeleted, endConnectTimeout, endICEFailed, endIdle, endShutdown, endDrainDeadline, endRemoteClosed, endBackend, endRTPTimeout} {
		m.ended.WithLabelValues(r)
	}
	if err := metric.Register(reg, "transceiver", append([]prometheus.Collector{m.sessions, m.created, m.rejected, m.ended,
		m.setupSeconds, m.popSwitches, m.earlySelects, m.addressChanges, m.iceRestarts, m.mediaPaths, m.droppedVec,
		m.sidebandAttaches, m.sidebandCloses, m.sidebandEvents, m.sidebands, m.calls, m.passCalls, m.callPktVec, m.dtmfVec}, m.net.Collectors()...)...); err != nil {
		return nil, err
	}
	if turnReg == nil {
		turnReg = reg
	}
	if err := metric.Register(turnReg, "transceiver turn", m.replyDelay, m.bargeinStop, m.replyAudio, m.bargeins); err != nil {
		return nil, err
	}
	return m, nil
}
