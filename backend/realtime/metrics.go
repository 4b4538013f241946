package realtime

// The connector's metrics: failure and drop reasons (each a label, zeroed
// at start-up), events and audio each way, and the server's ping RTT.

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend/oaievents"
)

// Failure reasons: the label of rtcedge_realtime_sessions_failed_total and
// the code of the error event the caller gets.
const (
	ReasonRefused = "backend_refused" // the server answered the upgrade with an HTTP error (bad key, unknown model)
	ReasonDial    = "backend_unreachable"
	ReasonSetup   = "backend_setup" // the first session.update failed, or no codec
	ReasonClosed  = "backend_closed"
	ReasonStalled = "backend_stalled" // no pong within StallTimeout
	// ReasonOversized: the server sent an event over Config.MaxMessage.
	ReasonOversized = "backend_oversized"
)

var failReasons = []string{ReasonRefused, ReasonDial, ReasonSetup, ReasonClosed, ReasonStalled, ReasonOversized}

// Drop reasons: the label of rtcedge_realtime_dropped_total.
const (
	dropQueueFull   = "queue_full"   // the queue toward the server was full (frames or bytes)
	dropAppendEvent = "append_event" // the caller sent input_audio_buffer.append on the data channel
	dropDecode      = "decode"       // a caller's Opus frame did not decode
	dropEncode      = "encode"       // a reply frame did not encode
	dropBadDelta    = "bad_delta"    // an audio delta that was not base64 PCM16 (the rest of it from the first bad chunk)
	dropLongID      = "long_id"      // an audio delta whose item_id or response_id is over maxIDLen bytes
	dropOwnError    = "own_error"    // the server's error about the edge's own cancel or truncate (not forwarded)
	dropSink        = "sink"         // the caller's side refused a frame or event
)

var dropReasons = []string{dropQueueFull, dropAppendEvent, dropDecode, dropEncode, dropBadDelta, dropLongID, dropOwnError, dropSink}

const (
	toBackend = "to_backend"
	toCaller  = "to_caller"
)

// metrics are a Backend's, shared by its calls; the label children are
// resolved once so the media path counts without allocating.
type metrics struct {
	opened               prometheus.Counter
	failed               *prometheus.CounterVec
	eventsTo, eventsFrom prometheus.Counter // to the backend, from it to the caller
	audioTo, audioFrom   prometheus.Counter // seconds of audio
	dropped              map[string]prometheus.Counter
	refused              *prometheus.CounterVec // caller events (or parts) refused, by oaievents reason
	openSeconds          prometheus.Histogram
	rtt                  prometheus.Histogram
	silent               prometheus.Counter // caller frames sent as silence undecoded
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_realtime_sessions_failed_total",
		Help: "Realtime backend sessions that failed to open or ended on the backend's side, by reason."}, []string{"reason"})
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_realtime_events_total",
		Help: "Realtime protocol events forwarded, by direction (to_backend, to_caller); audio deltas are not counted."}, []string{"direction"})
	audio := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_realtime_audio_seconds_total",
		Help: "Seconds of audio sent to the backend (to_backend) and encoded toward callers (to_caller; the pod paces it, rtcedge_reply_audio_seconds_total)."}, []string{"direction"})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_realtime_dropped_total",
		Help: "Frames and events the Realtime backend dropped, by reason."}, []string{"reason"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_realtime_caller_events_refused_total",
		Help: "Caller events refused whole (or, for session.update, in part) by the pod's translation, by reason (malformed, event_type, fields)."}, []string{"reason"})
	m := &metrics{
		refused: refused,
		opened: prometheus.NewCounter(prometheus.CounterOpts{Name: "rtcedge_realtime_sessions_opened_total",
			Help: "Realtime backend sessions opened (WebSocket up and session.update sent)."}),
		failed:     failed,
		eventsTo:   events.WithLabelValues(toBackend),
		eventsFrom: events.WithLabelValues(toCaller),
		audioTo:    audio.WithLabelValues(toBackend),
		audioFrom:  audio.WithLabelValues(toCaller),
		dropped:    make(map[string]prometheus.Counter, len(dropReasons)),
		openSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rtcedge_realtime_open_seconds",
			Help:    "Time to open a Realtime backend session (WebSocket handshake and first session.update).",
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 12)}),
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rtcedge_realtime_rtt_seconds",
			Help:    "Round-trip time of WebSocket pings to the Realtime backend.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		silent: prometheus.NewCounter(prometheus.CounterOpts{Name: "rtcedge_realtime_silent_frames_total",
			Help: "Caller frames its encoder marked as no speech that went to the backend as silence without being decoded."}),
	}
	for _, r := range failReasons {
		failed.WithLabelValues(r)
	}
	for _, r := range []string{oaievents.ReasonMalformed, oaievents.ReasonType, oaievents.ReasonFields} {
		refused.WithLabelValues(r)
	}
	for _, r := range dropReasons {
		m.dropped[r] = dropped.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.opened, failed, events, audio, dropped, refused, m.openSeconds, m.rtt, m.silent} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("realtime: register metrics: %w", err)
		}
	}
	return m, nil
}
