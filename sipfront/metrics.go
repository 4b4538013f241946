// The SIP front's metrics (docs/sip.md, "Metrics").

package sipfront

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/metric"
)

// Results of a request, the "result" label of rtcedge_sipfront_requests_total.
const (
	resultAnswered      = "answered"       // INVITE answered 200 with the pod's SDP
	resultOK            = "ok"             // ACK, BYE, OPTIONS taken
	resultForbidden     = "forbidden"      // no trunk holds the source, or bad digest credentials
	resultChallenged    = "challenged"     // 401 with a digest challenge
	resultNoOffer       = "no_offer"       // INVITE without SDP (not supported yet)
	resultUnsupported   = "unsupported"    // 415: a body that is not application/sdp
	resultTooLarge      = "too_large"      // 413: SDP over maxOffer or the session API's cap
	resultTrunkRate     = "trunk_rate"     // 503: the trunk's call rate
	resultTrunkFull     = "trunk_full"     // 503: the trunk's live calls at max_calls
	resultDialogsFull   = "dialogs_full"   // 503: this replica's live calls at max_dialogs
	resultNoCapacity    = "no_capacity"    // 503: no cluster took the call
	resultRejected      = "rejected"       // 488: the pod refused the offer
	resultCanceled      = "canceled"       // CANCEL before the answer: 487
	resultNoAck         = "no_ack"         // 200 never acknowledged: the call is ended
	resultNoDialog      = "no_dialog"      // 481 (BYE, CANCEL, re-INVITE of no dialog); ACK of none dropped
	resultNotAllowed    = "not_allowed"    // 405
	resultBadRequest    = "bad_request"    // 400: what the front needs is missing (Contact, CSeq)
	resultInDialog      = "in_dialog"      // re-INVITE: 488 for now, the call goes on
	resultServerError   = "server_error"   // 500: a fault of ours
	resultDeclined      = "declined"       // call control: /reject (or /hangup) answered with its status
	resultNoDecision    = "no_decision"    // call control: no accept or reject within accept_timeout: 480
	resultWebhookFailed = "webhook_failed" // call control: the webhook could not be delivered: 480
	resultSourceLimit   = "source_limit"   // dropped unanswered: the source's rate (rtcedge_sipfront_dropped_total)
	resultMalformed     = "malformed"      // dropped: the library could not parse it (rtcedge_sipfront_dropped_total)
)

// requestResults lists every result with its methods, to pre-create the series.
var requestResults = map[string][]string{
	"INVITE": {resultAnswered, resultForbidden, resultChallenged, resultNoOffer, resultUnsupported, resultTooLarge,
		resultTrunkRate, resultTrunkFull, resultDialogsFull, resultNoCapacity, resultRejected, resultCanceled, resultNoAck,
		resultNoDialog, resultBadRequest, resultInDialog, resultServerError, resultDeclined, resultNoDecision, resultWebhookFailed,
		"offer_syntax", "offer_no_audio", "offer_codec", "offer_address", "offer_sections"},
	"ACK":     {resultOK, resultNoDialog},
	"BYE":     {resultOK, resultNoDialog},
	"CANCEL":  {resultNoDialog},
	"OPTIONS": {resultOK, resultForbidden},
	"NOTIFY":  {resultOK, resultNoDialog, resultBadRequest},
	"other":   {resultNotAllowed},
}

type metrics struct {
	requests  *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	dialogs   prometheus.Gauge
	invite    *prometheus.HistogramVec
	byeErrors prometheus.Counter
	// The pods' own hangups (watch.go).
	podHangups  *prometheus.CounterVec
	watchErrors prometheus.Counter
	// Call control.
	webhooks       *prometheus.CounterVec
	webhookSeconds prometheus.Histogram
	control        *prometheus.CounterVec
	transfers      *prometheus.CounterVec
}

// Results of a webhook delivery, the "result" label of
// rtcedge_sipfront_webhooks_total.
var webhookResults = []string{"delivered", "timeout", "refused", "address", "abandoned", "failed"}

// controlActions and controlResults label rtcedge_sipfront_call_control_total.
var (
	controlActions = []string{"accept", "reject", "refer", "hangup"}
	controlResults = []string{"ok", "unauthorized", "not_found", "conflict", "invalid", "failed", "forwarded"}
)

// newMetrics builds and registers the front's own metrics; the shared
// placement's (rtcedge_sipfront_cluster_attempts_total, …) belong to the
// placer the front is given (NewNode registers them).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: metric.CounterVec("rtcedge_sipfront_requests_total", "SIP requests by method (INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY, other) and what became of them.", "method", "result"),
		dropped:  metric.CounterVec("rtcedge_sipfront_dropped_total", "SIP messages dropped unanswered, by reason (source_limit, malformed).", "reason"),
		dialogs:  metric.Gauge("rtcedge_sipfront_dialogs", "Live dialogs (calls) of this replica."),
		invite: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_sipfront_invite_seconds", Help: "From an INVITE to its final answer, by result.",
			Buckets: []float64{.005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56, 5.12},
		}, []string{"result"}),
		podHangups:  metric.CounterVec("rtcedge_sipfront_pod_hangups_total", "Calls the pod ended on its own, told to the carrier with BYE, by the pod's reason (rtp_timeout, backend_closed, deleted, shutdown, drain_deadline; gone: the pod no longer held the call; other).", "reason"),
		watchErrors: metric.Counter("rtcedge_sipfront_watch_errors_total", "Watches of a call's end at its cluster that failed (no answer, or an unusable one) and were asked again after 2 s."),
		byeErrors:   metric.Counter("rtcedge_sipfront_bye_errors_total", "BYEs the front sent that got no final answer (the carrier may keep a dead call)."),
		webhooks:    metric.CounterVec("rtcedge_sipfront_webhooks_total", "realtime.call.incoming deliveries by result (delivered, timeout, refused, address, abandoned, failed).", "result"),
		webhookSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "rtcedge_sipfront_webhook_seconds", Help: "One realtime.call.incoming delivery, from the POST to its answer or failure.",
			Buckets: []float64{.005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56, 5.12},
		}),
		transfers: metric.CounterVec("rtcedge_sipfront_transfers_total", "Transfers (/refer) the carrier took, by outcome (transferred, failed, timeout, ended).", "result"),
		control:   metric.CounterVec("rtcedge_sipfront_call_control_total", "Call-control API requests by action (accept, reject, refer, hangup) and result (ok, unauthorized, not_found, conflict, invalid, failed, forwarded).", "action", "result"),
	}
	for _, r := range []string{"transferred", "failed", "timeout", "ended"} {
		m.transfers.WithLabelValues(r)
	}
	for _, r := range webhookResults {
		m.webhooks.WithLabelValues(r)
	}
	for _, a := range controlActions {
		for _, r := range controlResults {
			m.control.WithLabelValues(a, r)
		}
	}
	for method, results := range requestResults {
		for _, r := range results {
			m.requests.WithLabelValues(method, r)
		}
	}
	for _, r := range []string{resultSourceLimit, resultMalformed} {
		m.dropped.WithLabelValues(r)
	}
	for _, r := range podEndReasons {
		m.podHangups.WithLabelValues(r)
	}
	all := []prometheus.Collector{m.requests, m.dropped, m.dialogs, m.invite, m.byeErrors, m.podHangups, m.watchErrors, m.webhooks, m.webhookSeconds, m.control, m.transfers}
	if err := metric.Register(reg, "sipfront", all...); err != nil {
		return nil, err
	}
	return m, nil
}

// methodLabel is the "method" label of a request's method.
func methodLabel(method string) string {
	if _, ok := requestResults[method]; ok {
		return method
	}
	return "other"
}
