// Package sessionapi holds the wire types of rtcedge's internal session
// API, the JSON over HTTP that signaling speaks to a cluster's session API
// front (served by the cluster relays) and that the front forwards to a
// transceiver pod. Both hops use the same paths and bodies, so the three
// packages involved share these definitions instead of keeping copies that
// can drift.
//
//	POST   SessionsPath        CreateRequest  -> 201 CreateResponse, 400/503/5xx apierr body
//	DELETE SessionsPath/{id}                  -> 204, 404
//	GET    StatusPath                         -> 200 (PodStatus on a pod)
//
// Every hop authenticates with a per-cluster bearer secret (Authorize,
// RequireSecret) over the transport the deployment gives it (TLS, see
// docs/operations.md).
package sessionapi

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
)

// Paths of the internal session API, the same on a pod and on a cluster's
// front.
const (
	SessionsPath = "/internal/v1/sessions"
	StatusPath   = "/internal/v1/status"
)

// MaxRequestBody caps a request body on every hop of the session API: a
// 64 KiB offer (signaling's default cap) and its JSON framing.
const MaxRequestBody = 96 << 10

// Encode is a request body: JSON without HTML escaping, which would make
// an offer's every '<', '>' and '&' six bytes and a valid offer too large
// for the next hop. Callers compare the result with MaxRequestBody.
func Encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// POP names a global relay POP whose VIP a session's answer advertises.
// The VIP travels as "ip:port".
type POP struct {
	ID  uint16         `json:"id"`
	VIP netip.AddrPort `json:"vip"`
	// TCPPort is the POP's ICE-TCP port on the VIP's address; 0: the
	// answer offers no TCP candidate for this POP.
	TCPPort uint16 `json:"tcp_port,omitempty"`
}

// CreateRequest is the JSON body of POST SessionsPath.
type CreateRequest struct {
	// Kind is the session's kind: KindWebRTC (empty) or KindRTP.
	Kind  string `json:"kind,omitempty"`
	Offer string `json:"offer"`
	// POPs to advertise, preferred first.
	POPs []POP `json:"pops"`
	// Config is the session configuration handed to the backend, a JSON
	// object or absent.
	Config json.RawMessage `json:"config,omitempty"`
	// Steer is the caller's steering key (internal/steer.Key's text form):
	// the pod reports the round trips it measures for the call under it
	// (docs/steering.md). Empty: nothing is reported.
	Steer string `json:"steer,omitempty"`
	// Caller is what the caller may change of the session over the
	// oai-events channel; nil (a signaling that predates it): the
	// defaults, DefaultClientSessionFields and no SealedWins.
	Caller *Caller `json:"caller,omitempty"`
}

// Caller is a call's policy for its caller's events, decided by signaling
// per call: from the client secret that placed it (sealed in the secret
// when it was minted), else from the API key's configuration, else from
// signaling's (docs/backends.md, "Caller events").
type Caller struct {
	// SessionFields are the top-level session fields the caller's
	// session.update may set. Empty: none.
	SessionFields []string `json:"session_fields"`
	// SealedWins drops the fields the caller may not set without an
	// error event, instead of naming them in one: for SDKs that always
	// send an agent's whole configuration.
	SealedWins bool `json:"sealed_wins,omitempty"`
}

// DefaultClientSessionFields are the session fields a caller may set when
// nothing else is configured (signaling's client_session_fields default,
// and a pod's for a request without Caller): how the call sounds and is
// transcribed, never what it costs beyond a reply's length or what the
// model is told. The model, instructions, tools, tool_choice, prompt and
// tracing are the app server's.
var DefaultClientSessionFields = []string{
	"type", "voice", "speed", "audio", "turn_detection",
	"input_audio_format", "output_audio_format", "input_audio_transcription", "input_audio_noise_reduction",
	"modalities", "output_modalities", "temperature", "max_response_output_tokens", "max_output_tokens", "include",
}

// Session kinds of CreateRequest.Kind.
const (
	// KindWebRTC is a WebRTC call: the offer is a browser's or SDK's
	// (ICE, DTLS, SRTP, Opus).
	KindWebRTC = ""
	// KindRTP is a phone call through the SIP front: the offer is the
	// carrier's SDP (plain RTP, no ICE; docs/wire.md §6).
	KindRTP = "rtp"
)

// CodeUnsupportedKind is the error code of a pod's 400 to a create of a
// kind it does not terminate: a refusal of the offer, not a fault.
const CodeUnsupportedKind = "unsupported_kind"

// HeaderSteerTicket carries, from the cluster's front to the pod it
// places a create on, the call's steering ticket (internal/steer,
// report.go): the pod reports the call's round trips with it.
const HeaderSteerTicket = "X-Rtcedge-Steer-Ticket"

// CreateResponse is the JSON body of a 201 from POST SessionsPath.
type CreateResponse struct {
	ID      string `json:"id"`
	Answer  string `json:"answer"`
	Cluster uint16 `json:"cluster"`
	Pod     uint16 `json:"pod"`
}

// PodStatus is the JSON body of GET StatusPath on a transceiver pod.
type PodStatus struct {
	Cluster  uint16 `json:"cluster"`
	Pod      uint16 `json:"pod"`
	Sessions int    `json:"sessions"`
	Capacity int    `json:"capacity"`
	Draining bool   `json:"draining"`
}

// Authorize sets the bearer secret of a request to a session API; an empty
// secret leaves the request without credentials.
func Authorize(req *http.Request, secret string) {
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
}

// SecretHash is the hex SHA-256 of a session API secret: what a pod is
// configured with (RequireSecretHash) so that it verifies the front's
// secret without holding it, and a compromised pod cannot call its
// cluster's other pods.
func SecretHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// RequireSecret wraps a session API handler so that every request but the
// health probes (/livez, /readyz, answered without credentials for
// kubelets) must carry "Authorization: Bearer <secret>"; others get 401.
// The comparison takes the same time whatever the presented value. An
// empty secret returns h unchanged (dev worlds and tests).
func RequireSecret(secret string, h http.Handler) http.Handler {
	if secret == "" {
		return h
	}
	return RequireSecretHash(SecretHash(secret), h)
}

// RequireAnySecret is RequireSecret accepting any of secrets: a pod's own
// credentials under every key ID its issuer gave it (internal/authority),
// so a rotation never refuses the front. No secrets: every request but the
// health probes is refused.
func RequireAnySecret(secrets []string, h http.Handler) http.Handler {
	want := make([][sha256.Size]byte, 0, len(secrets))
	for _, s := range secrets {
		if s != "" {
			want = append(want, sha256.Sum256([]byte(s)))
		}
	}
	return requireFunc(func(got [sha256.Size]byte) bool {
		ok := 0
		for _, w := range want {
			ok |= subtle.ConstantTimeCompare(got[:], w[:])
		}
		return ok == 1
	}, h)
}

// RequireSecretHash is RequireSecret for a server that holds only
// SecretHash of the secret. An empty hash returns h unchanged; a malformed
// one refuses every request.
func RequireSecretHash(hash string, h http.Handler) http.Handler {
	if hash == "" {
		return h
	}
	want, err := hex.DecodeString(hash)
	if err != nil || len(want) != sha256.Size {
		want = nil // refuses every request: a typo must not open the API
	}
	return requireFunc(func(got [sha256.Size]byte) bool {
		return want != nil && subtle.ConstantTimeCompare(got[:], want) == 1
	}, h)
}

// requireFunc wraps h so that every request but the health probes needs a
// bearer token whose SHA-256 match accepts; others get 401.
func requireFunc(match func([sha256.Size]byte) bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/livez" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || !match(sha256.Sum256([]byte(tok))) {
			apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "unauthorized",
				"the session API needs the cluster's bearer secret", 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// A phone call's end, watched by the SIP front (docs/sip.md, "Hangup from
// rtcedge's side"): GET SessionsPath/{id}/ended is held open by the pod
// until the call ends, then answered 200 with CallEnded; after
// CallEndedHold it is answered 204 and the front asks again. A call the
// pod no longer holds is a 404 session_not_found (it ended, or its pod is
// gone: the cluster's front answers that for a pod gossip dropped). The
// hold stays well inside the 15 s WriteTimeout of the project's HTTP
// servers (internal/node) on both hops: a front watching 1,000 calls asks
// 100 times a second.
const CallEndedHold = 10 * time.Second

// CallEndedPath is the path, under SessionsPath, of call id's end.
func CallEndedPath(id string) string { return "/" + id + "/ended" }

// CallEnded is the body of a 200 to GET SessionsPath/{id}/ended.
type CallEnded struct {
	// Reason is why the pod ended the call, the reason label of
	// rtcedge_transceiver_sessions_ended_total (rtp_timeout,
	// backend_closed, deleted, shutdown, …).
	Reason string `json:"reason"`
}
