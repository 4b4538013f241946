package clusterrelay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// The cluster's session API front. Signaling knows one session API per
// cluster; the cluster relays serve it (they already follow the cluster's
// pods through gossip): a create goes to the least-loaded ready pod, and
// when that pod refuses (full, draining) or fails, to the next; a delete
// goes to the pod named in the session ID. The front is stateless, so every
// replica can serve it behind one internal address.

const (
	sessionsPath  = sessionapi.SessionsPath
	podAttempts   = 2
	maxCreateBody = sessionapi.MaxRequestBody
)

// FrontConfig configures the session API front.
type FrontConfig struct {
	Cluster uint16
	Pods    *Directory
	// Timeout bounds one pod attempt; default 800ms, so that two attempts
	// fit in signaling's 2 s budget for the whole cluster.
	Timeout    time.Duration
	HTTPClient *http.Client // default: no proxy, short idle timeout
	Logger     *slog.Logger
	// GossipLag and PlacementHold tune how long the front counts the
	// sessions it placed on top of the pods' gossiped loads (placement.go);
	// defaults DefaultGossipLag and DefaultPlacementHold.
	GossipLag     time.Duration
	PlacementHold time.Duration
	// Now is the clock of placement bookkeeping; default time.Now.
	Now func() time.Time
	// Secret is the cluster's session API bearer secret: the front
	// requires it from signaling and presents it to the pods. Empty: no
	// credentials either way (dev worlds and tests).
	Secret string
	// PodSecret, when set, is the credential presented to each pod in
	// place of Secret: its own, derived by the deployment authority
	// (internal/authority), so that no pod ever sees the cluster's secret
	// or a credential another pod accepts.
	PodSecret func(pod uint16) string
	// Steer, when set, mints each create's steering ticket for the pod it
	// goes to (sessionapi.HeaderSteerTicket): the pod's round-trip
	// reports are believed only for the callers' networks and POPs of
	// the calls it was given (docs/steering.md). Each create asks for the
	// authority in use, so a key reload takes effect at once.
	Steer func() *steer.Authority
}

// Front serves the cluster's session API.
type Front struct {
	cfg    FrontConfig
	log    *slog.Logger
	placer *placer
	relays *sessionapi.Relays // sidebands (sideband.go); ended by Close
}

// NewFront returns the session API front.
func NewFront(cfg FrontConfig) *Front {
	config.Default(&cfg.Timeout, 800*time.Millisecond)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}}
	}
	config.Default(&cfg.Logger, slog.Default())
	config.Default(&cfg.GossipLag, DefaultGossipLag)
	config.Default(&cfg.PlacementHold, DefaultPlacementHold)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Front{cfg: cfg, log: cfg.Logger.With("component", "clusterapi", "cluster", cfg.Cluster),
		placer: newPlacer(cfg.GossipLag, cfg.PlacementHold, cfg.Now), relays: sessionapi.NewRelays()}
}

// ClusterStatus is the JSON body of GET /internal/v1/status on the front.
type ClusterStatus struct {
	Cluster  uint16    `json:"cluster"`
	Load     int       `json:"load"`
	Capacity int       `json:"capacity"`
	Ready    int       `json:"ready_pods"`
	Pods     []PodInfo `json:"pods"`
}

// Handler returns the front's HTTP API (same paths as a pod's). With
// FrontConfig.Secret set, all but /livez and /readyz need it as a bearer
// token.
func (f *Front) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+sessionsPath, f.create)
	mux.HandleFunc("DELETE "+sessionsPath+"/{id}", f.delete)
	mux.HandleFunc("PATCH "+sessionsPath+"/{id}", f.restart)         // ICE restart (restart.go)
	mux.HandleFunc("GET "+sessionsPath+"/{id}/sideband", f.sideband) // WebSocket (sideband.go)
	mux.HandleFunc("GET "+sessionsPath+"/{id}/ended", f.callEnded)   // a phone call's end, held (restart.go)
	mux.HandleFunc("GET "+sessionapi.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		load, capacity, ready := f.cfg.Pods.Aggregate()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ClusterStatus{Cluster: f.cfg.Cluster, Load: load, Capacity: capacity, Ready: ready, Pods: f.cfg.Pods.PodInfos()})
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if _, _, ready := f.cfg.Pods.Aggregate(); ready == 0 {
			http.Error(w, "no ready pods", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return sessionapi.RequireSecret(f.cfg.Secret, mux)
}

func (f *Front) create(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCreateBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large", "request body too large", 0)
		} else {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "unreadable_body", "could not read the request body", 0)
		}
		return
	}
	steerKey, pops := f.steerOf(body)
	for i, p := range f.placer.pick(f.cfg.Pods.PodInfos(), podAttempts) {
		if i > 0 {
			f.placer.reserve(p.ID)
		}
		var ticket string
		if steerKey.Valid() {
			if t, err := f.cfg.Steer().Mint(p.ID, steerKey, pops, f.cfg.Now()); err == nil {
				ticket = t.String()
			}
		}
		status, hdr, resp, err := f.forward(r.Context(), p.ID, http.MethodPost, p.API+sessionsPath, body, ticket)
		if err != nil {
			f.placer.done(p.ID, false)
			f.log.Warn("pod session API failed", "pod", p.ID, "err", err)
			continue
		}
		// Full, draining, failing, or refusing our credentials (a
		// misconfigured secret): the next pod may take it. A 401 must not
		// reach signaling, which would take it for its own credentials.
		if status == http.StatusServiceUnavailable || status >= 500 || status == http.StatusUnauthorized {
			if status == http.StatusUnauthorized {
				f.log.Warn("pod refused the cluster's session API secret", "pod", p.ID)
			}
			f.placer.done(p.ID, false)
			continue
		}
		if status == http.StatusCreated && !answersAs(resp, f.cfg.Cluster, p.ID) {
			// A pod answers only in its own name: an answer naming
			// another pod would send the call's later requests there.
			f.log.Warn("pod answered in another pod's name; refused", "pod", p.ID)
			f.placer.done(p.ID, false)
			continue
		}
		f.placer.done(p.ID, status == http.StatusCreated)
		copyResponse(w, status, hdr, resp)
		return
	}
	apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity", "no pod of this cluster can take a session", time.Second)
}

// steerOf is a create's steering key and POP IDs, when the front mints
// tickets and the create has a key; else the zero key.
func (f *Front) steerOf(body []byte) (steer.Key, []uint16) {
	if f.cfg.Steer == nil || f.cfg.Steer() == nil {
		return steer.Key{}, nil
	}
	var req struct {
		Steer string `json:"steer"`
		POPs  []struct {
			ID uint16 `json:"id"`
		} `json:"pops"`
	}
	if json.Unmarshal(body, &req) != nil || req.Steer == "" || len(req.POPs) > steer.MaxTicketPOPs {
		return steer.Key{}, nil
	}
	k, err := steer.ParseKey(req.Steer)
	if err != nil {
		return steer.Key{}, nil
	}
	pops := make([]uint16, len(req.POPs))
	for i, p := range req.POPs {
		pops[i] = p.ID
	}
	return k, pops
}

func (f *Front) delete(w http.ResponseWriter, r *http.Request) {
	f.toSessionPod(w, r, http.MethodDelete, nil)
}

// answersAs reports whether a 201 body is a session of (cluster, pod):
// its session ID names them (later requests are routed by it), and so do
// its cluster and pod fields when present.
func answersAs(body []byte, cluster, pod uint16) bool {
	var cr sessionapi.CreateResponse
	if json.Unmarshal(body, &cr) != nil || (cr.Cluster != 0 && cr.Cluster != cluster) || (cr.Pod != 0 && cr.Pod != pod) {
		return false
	}
	id, err := sessionid.Parse(cr.ID)
	return err == nil && id.Cluster == cluster && id.Pod == pod
}

// forward sends a request to pod at url with the credential the pod
// accepts (FrontConfig.PodSecret, else Secret) and, for a create, its
// steering ticket.
func (f *Front) forward(ctx context.Context, pod uint16, method, url string, body []byte, ticket string) (int, http.Header, []byte, error) {
	return f.forwardWithin(ctx, f.cfg.Timeout, pod, method, url, body, ticket)
}

// forwardWithin is forward with its own bound on the pod's answer.
func (f *Front) forwardWithin(ctx context.Context, timeout time.Duration, pod uint16, method, url string, body []byte, ticket string) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(url, "/"), bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	sessionapi.Authorize(req, f.podSecret(pod))
	if ticket != "" {
		req.Header.Set(sessionapi.HeaderSteerTicket, ticket)
	}
	resp, err := f.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
	if err != nil {
		return 0, nil, nil, errors.Join(errors.New("read pod answer"), err)
	}
	return resp.StatusCode, resp.Header, data, nil
}

// podSecret is the credential the front presents to pod
// (FrontConfig.PodSecret, else Secret).
func (f *Front) podSecret(pod uint16) string {
	if f.cfg.PodSecret != nil {
		return f.cfg.PodSecret(pod)
	}
	return f.cfg.Secret
}

func copyResponse(w http.ResponseWriter, status int, hdr http.Header, body []byte) {
	for _, k := range []string{"Content-Type", "Retry-After"} {
		if v := hdr.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
