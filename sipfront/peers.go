// Call control across front replicas: a call_id names the replica that
// holds the call, and a replica that receives a decision for another's
// call forwards it there (docs/sip.md, "Call control").

package sipfront

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
)

// forwardedHeader marks a request one replica forwarded to another: it is
// never forwarded again (no loops), whatever its call_id says.
const forwardedHeader = "Rtcedge-Forwarded"

// replicaName is what a replica may be called (it goes into call_ids).
var replicaName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// validatePeers checks Replica and APIPeers.
func (c *Config) validatePeers() error {
	var errs []error
	if c.Replica != "" && !replicaName.MatchString(c.Replica) {
		errs = append(errs, fmt.Errorf("replica %q: lower-case letters, digits and '-', at most 32", c.Replica))
	}
	if len(c.APIPeers) > 0 && c.Replica == "" {
		errs = append(errs, errors.New("api_peers needs replica (the name peers know this replica by)"))
	}
	for name, u := range c.APIPeers {
		if !replicaName.MatchString(name) {
			errs = append(errs, fmt.Errorf("api_peers: replica name %q: lower-case letters, digits and '-', at most 32", name))
		}
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || (p.Path != "" && p.Path != "/") {
			errs = append(errs, fmt.Errorf("api_peers[%s]: %q is not an http(s) base URL", name, u))
		}
	}
	return errors.Join(errs...)
}

// newCallID is a fresh call_id: "rtc_", this replica's name and "_" when
// it has one, then 128 random bits in hex.
func (f *Front) newCallID() string {
	if f.cfg.Replica == "" {
		return randomID("rtc_")
	}
	return randomID("rtc_" + f.cfg.Replica + "_")
}

// replicaOf is the replica a call_id names ("" for none).
func replicaOf(callID string) string {
	rest, ok := strings.CutPrefix(callID, "rtc_")
	if !ok {
		return ""
	}
	name, _, ok := strings.Cut(rest, "_")
	if !ok {
		return ""
	}
	return name
}

// peerFor is the base URL of the replica holding callID when that is a
// known peer and not this replica, and r was not forwarded already.
func (f *Front) peerFor(r *http.Request, callID string) (string, bool) {
	name := replicaOf(callID)
	if name == "" || name == f.cfg.Replica || r.Header.Get(forwardedHeader) != "" {
		return "", false
	}
	u, ok := f.cfg.APIPeers[name]
	return strings.TrimSuffix(u, "/"), ok
}

// forward relays an authenticated request to the replica at base and
// copies its answer (status, JSON body) back. A peer that cannot be
// reached is 502.
func (f *Front) forward(w http.ResponseWriter, r *http.Request, base string, body []byte) string {
	ctx, cancel := context.WithTimeout(r.Context(), f.cfg.InviteTimeout+f.cfg.AcceptTimeout+2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.URL.EscapedPath(), bytes.NewReader(body))
	if err != nil {
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "peer_unreachable", "the call's front could not be reached", 0)
		return "failed"
	}
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(forwardedHeader, f.cfg.Replica)
	res, err := f.peers.Do(req)
	if err != nil {
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "peer_unreachable", "the call's front could not be reached", 0)
		return "failed"
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(res.Body, maxControlBody))
	if ct := res.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(out)
	return "forwarded"
}
