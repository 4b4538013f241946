package signaling

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/placement"
)

type metrics struct {
	requests       *prometheus.CounterVec
	seconds        *prometheus.HistogramVec
	attempts       *prometheus.CounterVec
	attemptSeconds *prometheus.HistogramVec
	located        *prometheus.CounterVec
	noCapacity     prometheus.Counter
	rateLimited    *prometheus.CounterVec
	readTimeouts   prometheus.Counter
	secretsMinted  prometheus.Counter
	// refusedEndpoints counts gossiped session API endpoints the catalogue
	// does not allow, skipped when placing a call.
	refusedEndpoints prometheus.Counter
	// sidebandAttaches counts GET /v1/realtime?call_id= by result
	// (sideband.go); sidebands is how many this replica relays now.
	sidebandAttaches *prometheus.CounterVec
	sidebands        prometheus.Gauge
}

// newMetrics builds the metrics and sets every label value known up front
// to zero, so a dashboard sees a flat line rather than a missing series.
// When auth is set, it is exported as a gauge too.
func newMetrics(reg prometheus.Registerer, cat *geo.Catalogue, auth func() bool) (*metrics, error) {
	m := &metrics{
		requests: metric.CounterVec("rtcedge_signaling_requests_total", "HTTP requests, by endpoint and status code.", "endpoint", "code"),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_signaling_request_seconds", Help: "HTTP request duration, by endpoint.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"endpoint"}),
		attempts: metric.CounterVec("rtcedge_signaling_cluster_attempts_total", "Session creates sent to clusters, by cluster and result.", "cluster", "result"),
		attemptSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_signaling_cluster_attempt_seconds", Help: "Duration of one session create at a cluster, by result.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 3},
		}, []string{"result"}),
		located:          metric.CounterVec("rtcedge_signaling_located_total", "Valid offers by how the client was located (cf-headers, geoip, default).", "source"),
		noCapacity:       metric.Counter("rtcedge_signaling_no_capacity_total", "Offers refused with 503 because no cluster took them."),
		rateLimited:      metric.CounterVec("rtcedge_signaling_rate_limited_total", "Requests refused with 429, by the limit that refused them (address, api_key, client_secret).", "limit"),
		readTimeouts:     metric.Counter("rtcedge_signaling_body_timeouts_total", "Requests whose body stalled past the read timeout (408)."),
		secretsMinted:    metric.Counter("rtcedge_signaling_client_secrets_total", "Ephemeral client secrets minted."),
		refusedEndpoints: metric.Counter("rtcedge_signaling_refused_endpoints_total", "Gossiped session API endpoints skipped because the catalogue does not allow them (host off session_api and session_api_nets)."),
		sidebandAttaches: metric.CounterVec("rtcedge_signaling_sideband_attaches_total", "Sideband attaches (GET /v1/realtime?call_id=) that passed authentication, by result (attached, not_found, client_secret, too_many, cluster_unreachable, cluster_error, upgrade_failed).", "result"),
		sidebands:        metric.Gauge("rtcedge_signaling_sidebands", "Sideband WebSockets this replica relays now."),
	}
	for _, r := range attachResults {
		m.sidebandAttaches.WithLabelValues(r)
	}
	placement.Metrics{Attempts: m.attempts, AttemptSeconds: m.attemptSeconds, Located: m.located, NoCapacity: m.noCapacity}.Zero(cat)
	for _, l := range limitLabels {
		m.rateLimited.WithLabelValues(l)
	}
	all := []prometheus.Collector{m.requests, m.seconds, m.attempts, m.attemptSeconds, m.located,
		m.noCapacity, m.rateLimited, m.readTimeouts, m.secretsMinted, m.refusedEndpoints, m.sidebandAttaches, m.sidebands}
	if auth != nil {
		all = append(all, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rtcedge_signaling_gossip_authoritative",
			Help: "1 while gossip knows relays and decides cluster and POP health; 0 while signaling assumes everything healthy.",
		}, func() float64 {
			if auth() {
				return 1
			}
			return 0
		}))
	}
	if err := metric.Register(reg, "signaling", all...); err != nil {
		return nil, err
	}
	return m, nil
}
