// The client side of the clusters' internal session API, as the fronts
// (signaling, the SIP front) speak it.

package placement

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/metacheck"
	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// Clusters reaches the clusters' session APIs. Its fields are static after
// construction; it is safe for concurrent use and must not be copied after
// first use.
type Clusters struct {
	// HTTPClient makes every request; required.
	HTTPClient *http.Client
	// Timeout bounds one exchange with one cluster; required.
	Timeout time.Duration
	// Secrets are the clusters' bearer secrets, by cluster ID; a cluster
	// without one is called without credentials.
	Secrets map[uint16]string
	// Endpoints lists a cluster's live session API endpoints (from
	// gossip); nil or empty: the catalogue's session_api.
	Endpoints func(cluster uint16) []string
	// Refused counts gossiped endpoints the catalogue does not allow; may
	// be nil.
	Refused prometheus.Counter

	turn atomic.Uint32 // spreads requests over a cluster's live endpoints
}

// Base returns the base URL to reach a cluster's session API: one of the
// live endpoints gossip reports that the catalogue allows (spread over
// them), else the catalogue's address. An endpoint off the cluster's
// session_api host and session_api_nets is never sent an offer, whoever
// advertised it.
func (k *Clusters) Base(c geo.Cluster) string {
	if k.Endpoints != nil {
		var eps []string
		for _, ep := range k.Endpoints(c.ID) {
			if metacheck.APIAllowed(c.SessionAPI, c.SessionAPINets, ep) {
				eps = append(eps, ep)
			} else if k.Refused != nil {
				k.Refused.Inc()
			}
		}
		if len(eps) > 0 {
			return strings.TrimSuffix(eps[int(k.turn.Add(1))%len(eps)], "/")
		}
	}
	return strings.TrimSuffix(c.SessionAPI, "/")
}

// Exchange sends method to c's session API at sessionapi.SessionsPath +
// path within Timeout, body as JSON unless nil, and returns the status and
// at most limit bytes of the answer. Status 0: the cluster did not answer
// (err says why); err with a status: the body broke off.
func (k *Clusters) Exchange(ctx context.Context, c geo.Cluster, method, path string, body []byte, limit int64) (int, []byte, error) {
	return k.ExchangeWithin(ctx, k.Timeout, c, method, path, body, limit)
}

// ExchangeWithin is Exchange bounded by timeout instead of Timeout: for a
// request the cluster holds open (the SIP front's watch of a call's end,
// sessionapi.CallEndedHold).
func (k *Clusters) ExchangeWithin(ctx context.Context, timeout time.Duration, c geo.Cluster, method, path string, body []byte, limit int64) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.Base(c)+sessionapi.SessionsPath+path, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	sessionapi.Authorize(req, k.Secrets[c.ID])
	resp, err := k.HTTPClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s session: %w", strings.ToLower(method), err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return resp.StatusCode, data, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, data, nil
}

// offerCodes are the error codes with which a pod judges the caller's
// offer itself; a 400 with any of them is the caller's to see.
var offerCodes = map[string]bool{
	sdpcheck.CodeInvalidSDP: true, sdpcheck.CodeNotOffer: true, sdpcheck.CodeNoAudio: true, sdpcheck.CodeNoOpus: true,
	sdpcheck.CodeNoICECreds: true, sdpcheck.CodeNoFingerprint: true, sdpcheck.CodeTooManySection: true,
	sdpcheck.CodeBadFingerprint: true, sdpcheck.CodeNotSecure: true, sessionapi.CodeUnsupportedKind: true,
}

// podFaultError is a pod refusing a create for a reason other than the
// offer (invalid_pops, invalid_json): a server-side fault.
type podFaultError struct {
	cluster uint16
	code    string
}

func (e *podFaultError) Error() string {
	return fmt.Sprintf("cluster %d refused the create with %q, a fault on our side", e.cluster, e.code)
}

// badAnswerError is a session API answer that cannot be used as it is.
type badAnswerError struct{ msg string }

func (e *badAnswerError) Error() string { return e.msg }

// Create posts a create to one cluster's session API within Timeout. It
// returns the decoded answer of a 201, or the status and body of a 400
// carrying a JSON error about the offer; every other outcome is an error
// (a *badAnswerError when the cluster answered something unusable, a
// *podFaultError when a pod blamed input of ours).
func (k *Clusters) Create(ctx context.Context, c geo.Cluster, body []byte) (sessionapi.CreateResponse, int, []byte, error) {
	status, data, err := k.Exchange(ctx, c, http.MethodPost, "", body, 256<<10)
	if err != nil {
		return sessionapi.CreateResponse{}, 0, nil, fmt.Errorf("cluster %d: %w", c.ID, err)
	}
	switch {
	case status == http.StatusBadRequest:
		var e apierr.Body
		if err := json.Unmarshal(data, &e); err != nil {
			return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 400 without a JSON body", c.ID)}
		}
		if !offerCodes[e.Error.Code] {
			// The pod blames its input, but the offer passed our checks:
			// what it refuses is ours (POPs, config), and the next
			// cluster may well take it.
			return sessionapi.CreateResponse{}, status, nil, &podFaultError{cluster: c.ID, code: e.Error.Code}
		}
		return sessionapi.CreateResponse{}, status, data, nil
	case status != http.StatusCreated:
		return sessionapi.CreateResponse{}, status, nil, nil
	}
	var out sessionapi.CreateResponse
	if err := json.Unmarshal(data, &out); err != nil || out.Answer == "" {
		return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with a bad body (%v)", c.ID, err)}
	}
	// The ID is what a DELETE is routed by: it must name this cluster.
	if id, err := sessionid.Parse(out.ID); err != nil || id.Cluster != c.ID {
		return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with session id %q that does not name it", c.ID, out.ID)}
	}
	return out, status, nil, nil
}
