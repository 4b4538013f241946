package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/probe"
	"github.com/rtcedge/rtcedge/signaling"
)

const e2eAPIKey = "sk-e2e-0123456789abcdef"

// mintSecret asks signaling for an ephemeral client secret with the API
// key, the way an app server does, fixing the session config calls with it
// get.
func mintSecret(t *testing.T, client *http.Client, base string) signaling.ClientSecret {
	t.Helper()
	return mintSecretWith(t, client, base, `{"type":"realtime","model":"echo"}`)
}

func mintSecretWith(t *testing.T, client *http.Client, base, session string) signaling.ClientSecret {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/realtime/client_secrets",
		strings.NewReader(`{"expires_after":{"anchor":"created_at","seconds":600},"session":`+session+`}`))
	req.Header.Set("Authorization", "Bearer "+e2eAPIKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("mint client secret: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var cs signaling.ClientSecret
	if res.StatusCode != http.StatusOK || json.Unmarshal(body, &cs) != nil || !strings.HasPrefix(cs.Value, "ek_") {
		t.Fatalf("mint client secret: %d %s", res.StatusCode, body)
	}
	return cs
}

// multipartOffers turns the probe's application/sdp offer into the
// OpenAI-style multipart/form-data form (sdp and session fields), the way a
// browser using FormData sends it.
type multipartOffers struct {
	base    http.RoundTripper
	session string
}

func (m multipartOffers) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/sdp" {
		return m.base.RoundTrip(r)
	}
	offer, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := mw.WriteField("sdp", string(offer)); err != nil {
		return nil, err
	}
	if err := mw.WriteField("session", m.session); err != nil {
		return nil, err
	}
	if err := mw.Close(); err != nil {
		return nil, err
	}
	r2 := r.Clone(r.Context())
	r2.Body, r2.ContentLength = io.NopCloser(&buf), int64(buf.Len())
	r2.Header.Set("Content-Type", mw.FormDataContentType())
	return m.base.RoundTrip(r2)
}

// TestCallsWithEphemeralToken is the browser flow of the OpenAI-compatible
// API: a server mints an ephemeral secret with its API key, and the client
// places a real call through POST /v1/realtime/calls with it, sending the
// offer either as application/sdp or as multipart/form-data, hears its
// audio back and hangs up with the same secret.
func TestCallsWithEphemeralToken(t *testing.T) {
	w := startWorld(t, devworld.Config{APIKeys: []string{e2eAPIKey}, FlowIdle: time.Second, RouteTTL: time.Second})
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	tests := []struct {
		name string
		rt   http.RoundTripper
	}{
		{"application/sdp", tr},
		{"multipart", multipartOffers{base: tr, session: `{"type":"realtime","model":"echo"}`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			client := &http.Client{Transport: tc.rt}
			ek := mintSecret(t, client, w.SignalingURL)
			call, err := probe.Dial(ctx, probe.Config{
				SignalingURL: w.SignalingURL, Path: "/v1/realtime/calls", Token: ek.Value,
				HTTPClient: client, Logger: testLogger(),
			})
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer call.Close()
			if call.Region != "eu-central" || call.Cluster != "1" || call.POP != "fra" {
				t.Errorf("placed at %s/%s/%s, want eu-central/1/fra", call.Region, call.Cluster, call.POP)
			}
			if err := call.WaitEcho(ctx); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "20 echoed packets", func() bool { return call.Stats().Received >= 20 })
			tm := call.Timings()
			t.Logf("%s: signaling %v, DTLS connected %v, first echo %v", tc.name, tm.Signaling, tm.DTLSConnected, tm.FirstEcho)
			if err := call.Hangup(ctx); err != nil {
				t.Fatalf("hangup with the client secret: %v", err)
			}
			eventually(t, 5*time.Second, "no sessions", func() bool {
				return metricSum(t, w.Registry, "rtcedge_transceiver_sessions", nil) == 0
			})
		})
	}
	if v := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"reason": "deleted"}); v != 2 {
		t.Errorf("sessions ended by DELETE = %v, want 2", v)
	}
}

// withoutLines drops every SDP line starting with one of prefixes.
func withoutLines(sdp string, prefixes ...string) string {
	var keep []string
lines:
	for _, l := range strings.Split(sdp, "\r\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				continue lines
			}
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\r\n")
}

// multipartBody builds a multipart/form-data body from (name, value) pairs.
func multipartBody(t *testing.T, fields ...string) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for i := 0; i+1 < len(fields); i += 2 {
		if err := mw.WriteField(fields[i], fields[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), buf.String()
}

// badRequest is one malformed request and the error it must get.
type badRequest struct {
	name        string
	method      string
	path        string
	contentType string
	body        string
	chunked     bool // send without Content-Length
	auth        string
	status      int
	code        string
}

// TestSignalingBadInput sends every kind of malformed request through the
// dev world's real HTTP server: each gets a 4xx JSON error, and no pod
// allocates (or is even asked for) a session.
func TestSignalingBadInput(t *testing.T) {
	w := startWorld(t, devworld.Config{APIKeys: []string{e2eAPIKey}})
	offer := testsdp.Offer(t)
	key := "Bearer " + e2eAPIKey
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	ek := mintSecret(t, &http.Client{Transport: tr}, w.SignalingURL).Value
	forged := []byte(ek)
	forged[len(forged)-3] ^= 2
	unknownID, _ := sessionid.New(1, 1)
	foreignID, _ := sessionid.New(999, 1)

	const sdpPath, callsPath = "/v1/realtime/sdp", "/v1/realtime/calls"
	huge := offer + strings.Repeat("a=x-padding:"+strings.Repeat("z", 100)+"\r\n", 700)
	// Each multipart body has its own boundary, named in its content type.
	mpNoSDPCT, mpNoSDP := multipartBody(t, "session", `{"type":"realtime"}`)
	mpTwoSDPCT, mpTwoSDP := multipartBody(t, "sdp", offer, "sdp", offer)
	mpBadSessionCT, mpBadSession := multipartBody(t, "sdp", offer, "session", `[1,2]`)
	mpNotSDPCT, mpNotSDP := multipartBody(t, "sdp", "not an offer")
	mpCT, mpGood := multipartBody(t, "sdp", offer)
	tooManySections := offer + strings.Repeat("m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:96 VP8/90000\r\n", 17)

	tests := []badRequest{
		// Not an acceptable offer.
		{"not SDP", "POST", sdpPath, "application/sdp", "hello, world", false, key, 400, "invalid_sdp"},
		{"not SDP on calls", "POST", callsPath, "application/sdp", "{\"sdp\":1}", false, key, 400, "invalid_sdp"},
		{"empty body", "POST", sdpPath, "application/sdp", "", false, key, 400, "invalid_sdp"},
		{"no audio", "POST", sdpPath, "application/sdp", strings.ReplaceAll(offer, "m=audio", "m=video"), false, key, 400, "no_audio"},
		{"no Opus", "POST", sdpPath, "application/sdp", strings.ReplaceAll(offer, "opus/48000", "PCMU/8000"), false, key, 400, "no_opus"},
		{"missing ICE credentials", "POST", sdpPath, "application/sdp", withoutLines(offer, "a=ice-ufrag", "a=ice-pwd"), false, key, 400, "missing_ice_credentials"},
		{"missing ICE password", "POST", callsPath, "application/sdp", withoutLines(offer, "a=ice-pwd"), false, key, 400, "missing_ice_credentials"},
		{"missing fingerprint", "POST", sdpPath, "application/sdp", withoutLines(offer, "a=fingerprint"), false, key, 400, "missing_fingerprint"},
		{"too many media sections", "POST", sdpPath, "application/sdp", tooManySections, false, key, 400, "too_many_media_sections"},
		{"body over 64 KiB", "POST", sdpPath, "application/sdp", huge, false, key, 413, "body_too_large"},
		{"chunked body over 64 KiB", "POST", callsPath, "application/sdp", huge, true, key, 413, "body_too_large"},
		// Wrong content type or method.
		{"text/plain", "POST", sdpPath, "text/plain", offer, false, key, 415, "unsupported_media_type"},
		{"no content type", "POST", sdpPath, "", offer, false, key, 415, "unsupported_media_type"},
		{"multipart on the sdp endpoint", "POST", sdpPath, mpCT, mpGood, false, key, 415, "unsupported_media_type"},
		{"JSON on calls", "POST", callsPath, "application/json", `{"sdp":"v=0"}`, false, key, 415, "unsupported_media_type"},
		{"GET offer endpoint", "GET", sdpPath, "", "", false, key, 405, "method_not_allowed"},
		{"PUT calls", "PUT", callsPath, "application/sdp", offer, false, key, 405, "method_not_allowed"},
		{"GET session", "GET", "/v1/realtime/sessions/" + unknownID.String(), "", "", false, key, 405, "method_not_allowed"},
		{"DELETE client secrets", "DELETE", "/v1/realtime/client_secrets", "", "", false, key, 405, "method_not_allowed"},
		{"POST regions", "POST", "/v1/regions", "application/json", "{}", false, key, 405, "method_not_allowed"},
		{"unknown endpoint", "POST", "/v1/realtime/sdpx", "application/sdp", offer, false, key, 404, "not_found"},
		// Credentials.
		{"no credentials", "POST", sdpPath, "application/sdp", offer, false, "", 401, "missing_credentials"},
		{"wrong API key", "POST", sdpPath, "application/sdp", offer, false, "Bearer sk-e2e-wrong-wrong-wrong", 401, "invalid_api_key"},
		{"basic auth", "POST", callsPath, "application/sdp", offer, false, "Basic " + e2eAPIKey, 401, "invalid_authorization"},
		{"forged client secret", "POST", callsPath, "application/sdp", offer, false, "Bearer " + string(forged), 401, "invalid_client_secret"},
		{"malformed client secret", "POST", callsPath, "application/sdp", offer, false, "Bearer ek_abc.def", 401, "invalid_client_secret"},
		{"client secret minting a client secret", "POST", "/v1/realtime/client_secrets", "", "", false, "Bearer " + ek, 401, "api_key_required"},
		{"DELETE without credentials", "DELETE", "/v1/realtime/sessions/" + unknownID.String(), "", "", false, "", 401, "missing_credentials"},
		// Malformed multipart.
		{"multipart without boundary", "POST", callsPath, "multipart/form-data", mpGood, false, key, 400, "invalid_multipart"},
		{"multipart with another boundary", "POST", callsPath, "multipart/form-data; boundary=nope", mpGood, false, key, 400, "invalid_multipart"},
		{"multipart truncated", "POST", callsPath, mpCT, mpGood[:len(mpGood)/2], false, key, 400, "invalid_multipart"},
		{"multipart without sdp", "POST", callsPath, mpNoSDPCT, mpNoSDP, false, key, 400, "invalid_multipart"},
		{"multipart with two sdp fields", "POST", callsPath, mpTwoSDPCT, mpTwoSDP, false, key, 400, "invalid_multipart"},
		{"multipart session not an object", "POST", callsPath, mpBadSessionCT, mpBadSession, false, key, 400, "invalid_multipart"},
		{"multipart sdp not SDP", "POST", callsPath, mpNotSDPCT, mpNotSDP, false, key, 400, "invalid_sdp"},
		{"multipart over 64 KiB", "POST", callsPath, mpCT, strings.Replace(mpGood, offer, huge, 1), false, key, 413, "body_too_large"},
		// Sessions that do not exist.
		{"unknown session", "DELETE", "/v1/realtime/sessions/" + unknownID.String(), "", "", false, key, 404, "session_not_found"},
		{"unknown call", "DELETE", "/v1/realtime/calls/" + unknownID.String(), "", "", false, "Bearer " + ek, 404, "session_not_found"},
		{"session of an unknown cluster", "DELETE", "/v1/realtime/sessions/" + foreignID.String(), "", "", false, key, 404, "session_not_found"},
		{"malformed session ID", "DELETE", "/v1/realtime/sessions/rtc_nope", "", "", false, key, 404, "session_not_found"},
		{"session ID with a bad prefix", "DELETE", "/v1/realtime/sessions/xyz" + unknownID.String()[3:], "", "", false, key, 404, "session_not_found"},
		{"overlong session ID", "DELETE", "/v1/realtime/sessions/" + unknownID.String() + "AAAA", "", "", false, key, 404, "session_not_found"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Each case is its own client (its own loopback source
			// address), as the rate limit is per client.
			client := clientFrom(t, fmt.Sprintf("127.0.1.%d", i+1))
			res, body := sendBad(t, client, w.SignalingURL, tc)
			if res.StatusCode != tc.status {
				t.Errorf("status %d, want %d: %s", res.StatusCode, tc.status, body)
			}
			if ct := res.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			var e apierr.Body
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("error body %q is not JSON: %v", body, err)
			}
			if e.Error.Type == "" || e.Error.Message == "" || e.Error.Code != tc.code {
				t.Errorf("error %+v, want code %q", e.Error, tc.code)
			}
		})
	}
	for _, m := range []string{"rtcedge_transceiver_sessions_created_total", "rtcedge_transceiver_sessions", "rtcedge_transceiver_sessions_rejected_total"} {
		if v := metricSum(t, w.Registry, m, nil); v != 0 {
			t.Errorf("%s = %v after only malformed requests, want 0", m, v)
		}
	}
}

// clientFrom returns an HTTP client whose connections leave from the given
// loopback address.
func clientFrom(t *testing.T, local string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	tr := &http.Transport{Proxy: nil, DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// sendBad sends a request, waiting out a 429 as a well-behaved client does.
func sendBad(t *testing.T, client *http.Client, base string, tc badRequest) (*http.Response, []byte) {
	t.Helper()
	for {
		var body io.Reader = strings.NewReader(tc.body)
		if tc.chunked {
			body = io.MultiReader(body) // hides the length: sent chunked
		}
		req, err := http.NewRequest(tc.method, base+tc.path, body)
		if err != nil {
			t.Fatal(err)
		}
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusTooManyRequests {
			return res, data
		}
		ra, _ := strconv.Atoi(res.Header.Get("Retry-After"))
		t.Logf("rate-limited; retrying after %ds", ra)
		<-time.After(time.Duration(max(ra, 1)) * time.Second)
	}
}
