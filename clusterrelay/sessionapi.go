package clusterrelay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
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
	maxCreateBody = 96 << 10
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
}

// Front serves the cluster's session API.
type Front struct {
	cfg FrontConfig
	log *slog.Logger
}

// NewFront returns the session API front.
func NewFront(cfg FrontConfig) *Front {
	if cfg.Timeout == 0 {
		cfg.Timeout = 800 * time.Millisecond
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Front{cfg: cfg, log: cfg.Logger.With("component", "clusterapi", "cluster", cfg.Cluster)}
}

// ClusterStatus is the JSON body of GET /internal/v1/status on the front.
type ClusterStatus struct {
	Cluster  uint16    `json:"cluster"`
	Load     int       `json:"load"`
	Capacity int       `json:"capacity"`
	Ready    int       `json:"ready_pods"`
	Pods     []PodInfo `json:"pods"`
}

// Handler returns the front's HTTP API (same paths as a pod's).
func (f *Front) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+sessionsPath, f.create)
	mux.HandleFunc("DELETE "+sessionsPath+"/{id}", f.delete)
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
	return mux
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
	for _, p := range pickPods(f.cfg.Pods.PodInfos(), podAttempts) {
		status, hdr, resp, err := f.forward(r.Context(), http.MethodPost, p.API+sessionsPath, body)
		if err != nil {
			f.log.Warn("pod session API failed", "pod", p.ID, "err", err)
			continue
		}
		if status == http.StatusServiceUnavailable || status >= 500 {
			continue
		}
		copyResponse(w, status, hdr, resp)
		return
	}
	apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity", "no pod of this cluster can take a session", time.Second)
}

// pickPods orders up to n ready pods to try. The first is the less loaded
// of two picked at random ("power of two choices"): every front replica
// sorting by the same second-old gossip would send a burst of calls to the
// same pod, while two random choices spread it and still favour free pods.
func pickPods(pods []PodInfo, n int) []PodInfo {
	ready := make([]PodInfo, 0, len(pods))
	for _, p := range pods {
		if p.Ready() {
			ready = append(ready, p)
		}
	}
	rand.Shuffle(len(ready), func(i, j int) { ready[i], ready[j] = ready[j], ready[i] })
	if len(ready) >= 2 && share(ready[1]) < share(ready[0]) {
		ready[0], ready[1] = ready[1], ready[0]
	}
	return ready[:min(len(ready), n)]
}

func share(p PodInfo) float64 { return float64(p.Load) / float64(max(p.Capacity, 1)) }

func (f *Front) delete(w http.ResponseWriter, r *http.Request) {
	raw := r.PathValue("id")
	id, err := sessionid.Parse(raw)
	if err != nil || id.Cluster != f.cfg.Cluster {
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
		return
	}
	for _, p := range f.cfg.Pods.PodInfos() {
		if p.ID != id.Pod {
			continue
		}
		status, hdr, resp, err := f.forward(r.Context(), http.MethodDelete, p.API+sessionsPath+"/"+raw, nil)
		if err != nil {
			apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "pod_unreachable", "the session's pod did not answer", 0)
			return
		}
		copyResponse(w, status, hdr, resp)
		return
	}
	// The pod is gone, and its sessions with it.
	apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
}

func (f *Front) forward(ctx context.Context, method, url string, body []byte) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(url, "/"), bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
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

func copyResponse(w http.ResponseWriter, status int, hdr http.Header, body []byte) {
	for _, k := range []string{"Content-Type", "Retry-After"} {
		if v := hdr.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
