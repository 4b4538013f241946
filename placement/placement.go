// Package placement places a call on a transceiver pod for every front
// that takes calls (signaling for WebRTC, sipfront for SIP): the session
// merge (session.go), the choice of clusters and POPs, and the attempts at
// the clusters' session APIs, nearest first, until one answers
// (clusters.go). It returns a result or a typed error and writes nothing:
// each front answers in its own protocol.
package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// ReasonOverride is Result.Reason for POPs an operator chose (a pin).
const ReasonOverride = "override"

// Sentinel errors of Place.
var (
	// ErrNoCluster: no cluster or no POP is usable for the caller (all
	// down, full or draining as gossip reports them); nothing was asked.
	ErrNoCluster = errors.New("placement: no usable cluster or POP")
	// ErrNoCapacity: every cluster asked refused, failed or timed out.
	ErrNoCapacity = errors.New("placement: no cluster took the call")
)

// RejectedError is a pod judging the offer itself bad: another cluster
// would say the same. Body is the pod's JSON error, for the caller.
type RejectedError struct{ Body []byte }

func (e *RejectedError) Error() string {
	return "placement: the pod refused the offer: " + string(e.Body)
}

// TooLargeError is a create request over the session API's cap once
// encoded (JSON escapes control characters to six bytes each, so a request
// under a front's own cap can still be; the clusters would refuse it one
// after another).
type TooLargeError struct {
	What string // the caller's part of the request, e.g. "offer"
	Size int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the %s takes %d bytes once encoded, over %d", e.What, e.Size, sessionapi.MaxRequestBody)
}

// Metrics are a front's placement metrics, named by the front (so each
// keeps its series): every field is required.
type Metrics struct {
	// Attempts counts creates sent to clusters by cluster and result
	// (Results).
	Attempts *prometheus.CounterVec
	// AttemptSeconds times one create at a cluster, by result.
	AttemptSeconds *prometheus.HistogramVec
	// Located counts placed requests by how the caller was located.
	Located *prometheus.CounterVec
	// NoCapacity counts requests no cluster took (ErrNoCluster,
	// ErrNoCapacity).
	NoCapacity prometheus.Counter
}

// NewMetrics builds a front's placement metrics named
// rtcedge_<component>_cluster_attempts_total, …_cluster_attempt_seconds,
// …_located_total and …_no_capacity_total, with every label value known up
// front set to zero, and returns them with the collectors to register.
func NewMetrics(component string, cat *geo.Catalogue) (Metrics, []prometheus.Collector) {
	p := "rtcedge_" + component + "_"
	m := Metrics{
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: p + "cluster_attempts_total",
			Help: "Session creates sent to clusters, by cluster and result."}, []string{"cluster", "result"}),
		AttemptSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: p + "cluster_attempt_seconds", Help: "Duration of one session create at a cluster, by result.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 3},
		}, []string{"result"}),
		Located: prometheus.NewCounterVec(prometheus.CounterOpts{Name: p + "located_total",
			Help: "Placed calls by how the caller was located (cf-headers, geoip, default)."}, []string{"source"}),
		NoCapacity: prometheus.NewCounter(prometheus.CounterOpts{Name: p + "no_capacity_total",
			Help: "Calls refused because no cluster took them."}),
	}
	m.Zero(cat)
	return m, []prometheus.Collector{m.Attempts, m.AttemptSeconds, m.Located, m.NoCapacity}
}

// Zero sets every label value known up front to zero, so a dashboard sees
// a flat line rather than a missing series.
func (m Metrics) Zero(cat *geo.Catalogue) {
	for _, res := range Results {
		m.AttemptSeconds.WithLabelValues(res)
		for _, r := range cat.Regions {
			for _, c := range r.Clusters {
				m.Attempts.WithLabelValues(strconv.Itoa(int(c.ID)), res)
			}
		}
	}
	for _, src := range []string{geo.SourceCFHeaders, geo.SourceGeoIP, geo.SourceDefault} {
		m.Located.WithLabelValues(src)
	}
}

// Config is what a Placer is built from; the caller owns it.
type Config struct {
	Catalogue *geo.Catalogue // required
	// Health reports clusters' gossip state; nil: all healthy.
	Health geo.HealthFunc
	// POPUp reports whether a POP has live global relays; nil: all up.
	POPUp func(pop uint16) bool
	// POPs picks the call's POPs (first and backup) for the caller and
	// says why (the reason a front reports); when the first was not chosen
	// by distance it may move that POP's region's clusters to the front of
	// choice. nil: the catalogue's nearest two, "distance".
	POPs func(loc geo.Location, key steer.Key, choice *geo.Choice) ([]geo.POP, string)
	// Clusters reaches the session APIs; required.
	Clusters *Clusters
	// MaxAttempts bounds the clusters asked per call; required (> 0).
	MaxAttempts int
	Metrics     Metrics
	Logger      *slog.Logger     // required
	Now         func() time.Time // required
}

// Placer places calls. It holds no state of its own; it is safe for
// concurrent use.
type Placer struct {
	cfg Config // static after New
}

// New returns a Placer over cfg.
func New(cfg Config) (*Placer, error) {
	if cfg.Catalogue == nil || cfg.Clusters == nil || cfg.MaxAttempts <= 0 || cfg.Logger == nil || cfg.Now == nil ||
		cfg.Metrics.Attempts == nil || cfg.Metrics.AttemptSeconds == nil || cfg.Metrics.Located == nil || cfg.Metrics.NoCapacity == nil {
		return nil, errors.New("placement: catalogue, clusters, attempts, logger, clock and metrics are required")
	}
	return &Placer{cfg: cfg}, nil
}

// Request is a call to place.
type Request struct {
	// Loc is where the caller is (the client, or the carrier's edge).
	Loc geo.Location
	// Create is the request to the session API; Place sets its POPs and
	// Steer.
	Create sessionapi.CreateRequest
	// What names the caller's part of Create in a TooLargeError ("offer").
	What string
	// Pin, when set, are the call's POPs (first preferred; a SIP trunk's
	// pin), taken instead of choosing them; the reason is "override".
	Pin []geo.POP
}

// Result says where a call was placed.
type Result struct {
	Session sessionapi.CreateResponse
	Cluster geo.Cluster
	Region  string
	// POPs are the call's POPs, first preferred (at most two).
	POPs []geo.POP
	// Reason says why POPs[0] was chosen (distance, measured, explore,
	// override).
	Reason string
	// Attempt is the 1-based number of the cluster that took the call.
	Attempt int
}

// SteerKey is the steering key of a located caller (docs/steering.md).
func SteerKey(loc geo.Location) steer.Key {
	return steer.KeyFor(loc.IP, loc.Source != geo.SourceDefault, loc.Point.Lat, loc.Point.Lon)
}

// Place chooses where the call goes and asks the clusters nearest first
// until one answers. Errors: ErrNoCluster, ErrNoCapacity, a *RejectedError,
// a *TooLargeError, an encoding error, or ctx's error once the caller left.
func (p *Placer) Place(ctx context.Context, req Request) (Result, error) {
	cfg := p.cfg
	cfg.Metrics.Located.WithLabelValues(req.Loc.Source).Inc()
	// The catalogue's steering overrides (per country/continent) win over
	// distance; see geo.Catalogue.ChooseFor.
	choice := cfg.Catalogue.ChooseFor(req.Loc, cfg.Health)
	key := SteerKey(req.Loc)
	var pops []geo.POP
	reason := steer.ByDistance.String()
	switch {
	case len(req.Pin) > 0:
		pops, reason = req.Pin, ReasonOverride
	case cfg.POPs != nil:
		pops, reason = cfg.POPs(req.Loc, key, &choice)
	default:
		pops = cfg.Catalogue.ChoosePOPsFor(req.Loc, 2, cfg.POPUp)
	}
	if len(choice.Clusters) == 0 || len(pops) == 0 {
		cfg.Metrics.NoCapacity.Inc()
		cfg.Logger.Warn("no usable cluster or POP", "clusters", len(choice.Clusters), "pops", len(pops), "client", req.Loc.IP)
		return Result{}, ErrNoCluster
	}
	create := req.Create
	create.Steer = key.String()
	create.POPs = nil
	for _, pop := range pops {
		create.POPs = append(create.POPs, sessionapi.POP{ID: pop.ID, VIP: pop.VIP, TCPPort: pop.TCPPort})
	}
	body, err := sessionapi.Encode(create)
	if err != nil {
		return Result{}, fmt.Errorf("encode a session API request: %w", err)
	}
	if len(body) > sessionapi.MaxRequestBody {
		return Result{}, &TooLargeError{What: req.What, Size: len(body)}
	}
	start := cfg.Now()
	attempts := min(len(choice.Clusters), cfg.MaxAttempts)
	for i, cc := range choice.Clusters[:attempts] {
		if err := ctx.Err(); err != nil {
			return Result{}, err // the caller left; a late answer would go nowhere
		}
		t0 := cfg.Now()
		res, status, errBody, err := cfg.Clusters.Create(ctx, cc.Cluster, body)
		result := attemptResult(status, err)
		cfg.Metrics.Attempts.WithLabelValues(strconv.Itoa(int(cc.Cluster.ID)), result).Inc()
		cfg.Metrics.AttemptSeconds.WithLabelValues(result).Observe(cfg.Now().Sub(t0).Seconds())
		switch result {
		case resultCreated:
			cfg.Logger.Debug("call placed", "session", res.ID, "cluster", cc.Cluster.ID, "attempt", i+1,
				"elapsed", cfg.Now().Sub(start), "pop", pops[0].ID, "steering", reason, "client", req.Loc.IP, "located_by", req.Loc.Source)
			return Result{Session: res, Cluster: cc.Cluster, Region: cc.Region, POPs: pops, Reason: reason, Attempt: i + 1}, nil
		case resultRejected:
			// (A 400 about anything else is a fault of ours, counted as
			// a server error.)
			return Result{}, &RejectedError{Body: errBody}
		}
		// Down, slow, full, draining or confused: the next-nearest cluster
		// gets the call.
		cfg.Logger.Warn("cluster did not take the session, trying the next", "cluster", cc.Cluster.ID,
			"result", result, "status", status, "err", err, "elapsed", cfg.Now().Sub(t0))
	}
	cfg.Metrics.NoCapacity.Inc()
	return Result{}, ErrNoCapacity
}

// Results of one cluster attempt, the "result" label of the attempt metrics.
const (
	resultCreated     = "created"
	resultRejected    = "rejected"     // 400 with a JSON error saying the offer is bad
	resultUnavailable = "unavailable"  // 503: full or draining
	resultServerError = "server_error" // 5xx, or a 400 about anything but the offer
	resultBadAnswer   = "bad_answer"   // any other status, or a 201 that does not decode
	resultTimeout     = "timeout"
	resultError       = "error" // refused, reset, unreachable
)

// Results lists the values of the attempt metrics' "result" label.
var Results = []string{resultCreated, resultRejected, resultUnavailable, resultServerError, resultBadAnswer, resultTimeout, resultError}

func attemptResult(status int, err error) string {
	var bad *badAnswerError
	var fault *podFaultError
	switch {
	case errors.As(err, &fault):
		return resultServerError
	case errors.As(err, &bad):
		return resultBadAnswer
	case errors.Is(err, context.DeadlineExceeded):
		return resultTimeout
	case err != nil:
		return resultError
	case status == http.StatusCreated:
		return resultCreated
	case status == http.StatusBadRequest:
		return resultRejected
	case status == http.StatusServiceUnavailable:
		return resultUnavailable
	case status >= 500:
		return resultServerError
	default:
		return resultBadAnswer
	}
}
