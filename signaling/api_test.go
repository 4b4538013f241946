package signaling_test

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/signaling"
)

const testAPIKey = "sk-test-0123456789abcdef"

// clock is a settable Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

// mint asks for a client secret with an API key.
func (w *world) mint(t *testing.T, body string) signaling.ClientSecret {
	t.Helper()
	ct := ""
	if body != "" {
		ct = "application/json"
	}
	res, data := recorded(w.do(t, http.MethodPost, "/v1/realtime/client_secrets", "127.0.0.1", ct, body, bearer(testAPIKey)))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("mint: %d %s", res.StatusCode, data)
	}
	var cs signaling.ClientSecret
	if err := json.Unmarshal(data, &cs); err != nil {
		t.Fatalf("mint: %s: %v", data, err)
	}
	return cs
}

// configOf checks that a minted secret's session is shaped as OpenAI's
// session object (id "sess_" and the secret's ID in hex, object
// "realtime.session", a type) and returns the configuration without id
// and object, canonical.
func configOf(t *testing.T, cs signaling.ClientSecret) []byte {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal(cs.Session, &obj); err != nil {
		t.Fatalf("client secret session %s: %v", cs.Session, err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(cs.Value, "ek_"))
	if want := "sess_" + hex.EncodeToString(raw[:12]); obj["id"] != want {
		t.Errorf("session id %v, want %s", obj["id"], want)
	}
	want := "realtime.session"
	if obj["type"] == "transcription" {
		want = "realtime.transcription_session"
	}
	if obj["object"] != want || obj["type"] == nil {
		t.Errorf("session object %v, type %v: want object %s and a type", obj["object"], obj["type"], want)
	}
	delete(obj, "id")
	delete(obj, "object")
	out, _ := json.Marshal(obj)
	return out
}

// TestClientSecretShapedAsOpenAIs: the answer carries OpenAI's session
// object whatever the request held: id, object and type (realtime unless
// the server asked for a transcription session) beside the configuration.
func TestClientSecretShapedAsOpenAIs(t *testing.T) {
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) { c.APIKeys, c.AllowAnonymous = []string{testAPIKey}, false }})
	for _, tc := range []struct{ body, want string }{
		{"", `{"type":"realtime"}`},
		{`{"session":{"instructions":"x","audio":{"output":{"voice":"marin"}}}}`, `{"audio":{"output":{"voice":"marin"}},"instructions":"x","type":"realtime"}`},
		{`{"session":{"type":"transcription"}}`, `{"type":"transcription"}`},
	} {
		cs := w.mint(t, tc.body)
		if got := string(configOf(t, cs)); got != tc.want {
			t.Errorf("mint %s: session %s, want %s with id and object", tc.body, cs.Session, tc.want)
		}
	}
	// Two secrets are two sessions.
	a, b := w.mint(t, ""), w.mint(t, "")
	if string(a.Session) == string(b.Session) {
		t.Errorf("two secrets got the same session %s", a.Session)
	}
}

// TestSignalingClientSecrets mints ephemeral secrets with an API key, places
// a call with one, and checks they expire, cannot be forged, cannot mint
// further secrets, and still hang up a call after expiry.
func TestSignalingClientSecrets(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
		c.APIKeys, c.AllowAnonymous = []string{testAPIKey}, false
		c.Now = clk.now
	}})
	other := newWorld(t, worldConfig{api: map[uint16]string{1: "http://127.0.0.1:1", 2: "http://127.0.0.1:1", 3: "http://127.0.0.1:1"},
		tweak: func(c *signaling.Config) { c.APIKeys, c.AllowAnonymous = []string{testAPIKey}, false }})
	offer := testsdp.Offer(t)

	cs := w.mint(t, "")
	if !strings.HasPrefix(cs.Value, "ek_") || cs.ExpiresAt != clk.now().Add(10*time.Minute).Unix() {
		t.Fatalf("minted %+v, want an ek_ secret expiring in 10 minutes", cs)
	}
	short := w.mint(t, `{"expires_after":{"anchor":"created_at","seconds":60},"session":{"type":"realtime"}}`)
	if short.ExpiresAt != clk.now().Add(time.Minute).Unix() || string(configOf(t, short)) != `{"type":"realtime"}` {
		t.Fatalf("minted %+v, want a 60 s secret echoing the session", short)
	}
	forged := []byte(cs.Value)
	forged[len(forged)-2] ^= 1 // a flipped MAC bit
	foreign := other.mint(t, "")

	post := func(hdr http.Header) (*http.Response, []byte, func()) {
		rec := w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, "application/sdp", offer, hdr)
		res, body := recorded(rec)
		return res, body, func() { w.hangup(t, rec, hdr) }
	}

	// The secret places a call, and so does the API key itself.
	for _, tok := range []string{cs.Value, testAPIKey} {
		res, body, hangup := post(bearer(tok))
		checkPlaced(t, res, body, inAshburn)
		hangup()
	}

	rejected := []struct {
		name string
		hdr  http.Header
		code string
	}{
		{"no credentials", nil, "missing_credentials"},
		{"wrong API key", bearer("sk-test-not-the-right-key"), "invalid_api_key"},
		{"basic scheme", http.Header{"Authorization": {"Basic " + testAPIKey}}, "invalid_authorization"},
		{"empty bearer", http.Header{"Authorization": {"Bearer "}}, "invalid_authorization"},
		{"forged MAC", bearer(string(forged)), "invalid_client_secret"},
		{"secret of another deployment", bearer(foreign.Value), "invalid_client_secret"},
		{"truncated secret", bearer(cs.Value[:20]), "invalid_client_secret"},
		{"not base64", bearer("ek_" + strings.Repeat("!", 22) + "." + strings.Repeat("!", 22)), "invalid_client_secret"},
	}
	for _, tc := range rejected {
		t.Run(tc.name, func(t *testing.T) {
			res, body, _ := post(tc.hdr)
			wantAPIError(t, res, body, http.StatusUnauthorized, tc.code)
		})
	}

	// A live call outlives its secret: hang-up still works after expiry,
	// a new call does not.
	rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", ipAshburn, "application/sdp", offer, bearer(short.Value))
	if rec.Code != http.StatusCreated {
		t.Fatalf("call with the short secret: %d %s", rec.Code, rec.Body)
	}
	clk.advance(time.Minute)
	res, body, _ := post(bearer(short.Value))
	wantAPIError(t, res, body, http.StatusUnauthorized, "expired_client_secret")
	w.hangup(t, rec, bearer(short.Value))

	// Minting needs an API key and a sane request.
	mintRejected := []struct {
		name        string
		hdr         http.Header
		contentType string
		body        string
		status      int
		code        string
	}{
		{"with a client secret", bearer(cs.Value), "", "", http.StatusUnauthorized, "api_key_required"},
		{"without credentials", nil, "", "", http.StatusUnauthorized, "missing_credentials"},
		{"not JSON", bearer(testAPIKey), "application/json", "{", http.StatusBadRequest, "invalid_json"},
		{"unknown field", bearer(testAPIKey), "application/json", `{"ttl":5}`, http.StatusBadRequest, "invalid_json"},
		{"expiry too short", bearer(testAPIKey), "application/json", `{"expires_after":{"seconds":5}}`, http.StatusBadRequest, "invalid_expiry"},
		{"expiry too long", bearer(testAPIKey), "application/json", `{"expires_after":{"seconds":86400}}`, http.StatusBadRequest, "invalid_expiry"},
		{"bad anchor", bearer(testAPIKey), "application/json", `{"expires_after":{"anchor":"now","seconds":60}}`, http.StatusBadRequest, "invalid_expiry"},
		{"form body", bearer(testAPIKey), "application/x-www-form-urlencoded", "seconds=60", http.StatusUnsupportedMediaType, "unsupported_media_type"},
	}
	for _, tc := range mintRejected {
		t.Run("mint "+tc.name, func(t *testing.T) {
			res, body := recorded(w.do(t, http.MethodPost, "/v1/realtime/client_secrets", "127.0.0.1", tc.contentType, tc.body, tc.hdr))
			wantAPIError(t, res, body, tc.status, tc.code)
		})
	}
	if n := w.pods[2].created(t); n != 3 {
		t.Errorf("us-east pod created %v sessions, want 3 (one per accepted call)", n)
	}
}

// TestSignalingRateLimit exhausts one client's budget: it gets 429 with
// Retry-After, other clients (also those behind a trusted proxy, told apart
// by X-Forwarded-For) are unaffected, and the budget refills with time.
func TestSignalingRateLimit(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	w := newWorld(t, worldConfig{proxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, tweak: func(c *signaling.Config) {
		c.RatePerSecond, c.RateBurst = 1, 3
		c.Now = clk.now
	}})
	// Rate limiting comes before authentication and validation, so a
	// request with a bad offer counts too (and is a cheap 400).
	get := func(peer string, hdr http.Header) *http.Response {
		res, _ := recorded(w.do(t, http.MethodPost, "/v1/realtime/sdp", peer, "application/sdp", "v=0", hdr))
		return res
	}
	for i := range 3 {
		if res := get(ipAshburn, nil); res.StatusCode != http.StatusBadRequest {
			t.Fatalf("request %d: %d, want 400 within the burst", i, res.StatusCode)
		}
	}
	res, body := recorded(w.do(t, http.MethodPost, "/v1/realtime/sdp", ipAshburn, "application/sdp", "v=0", nil))
	wantAPIError(t, res, body, http.StatusTooManyRequests, "rate_limited")
	if ra, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q", res.Header.Get("Retry-After"))
	}
	if res := get(ipSingapore, nil); res.StatusCode != http.StatusBadRequest {
		t.Errorf("another client: %d, want 400", res.StatusCode)
	}
	for i := range 3 {
		if res := get("10.0.0.1", http.Header{"X-Forwarded-For": {"203.0.113." + strconv.Itoa(i+1)}}); res.StatusCode != http.StatusBadRequest {
			t.Errorf("client %d behind the proxy: %d, want 400", i, res.StatusCode)
		}
	}
	clk.advance(time.Second)
	if res := get(ipAshburn, nil); res.StatusCode != http.StatusBadRequest {
		t.Errorf("after a second: %d, want 400 again", res.StatusCode)
	}
	if v := metricValue(t, w, "rtcedge_signaling_rate_limited_total", nil); v != 1 {
		t.Errorf("rate_limited_total = %v, want 1", v)
	}
}

// TestSignalingStalledClient runs signaling behind a real http.Server with
// short read timeouts and plays slowloris: a body that stops arriving gets a
// 408 and the connection closed, headers that stop arriving get the
// connection closed, and no session is allocated for either.
func TestSignalingStalledClient(t *testing.T) {
	w := newWorld(t, worldConfig{})
	const headerTimeout, readTimeout = 300 * time.Millisecond, 600 * time.Millisecond
	base := serve(t, w.h, signaling.WithReadTimeouts(headerTimeout, readTimeout))
	addr := strings.TrimPrefix(base, "http://")
	offer := testsdp.Offer(t)

	tests := []struct {
		name   string
		send   string
		status int // 0: the connection is closed without an answer
	}{
		{"stalled body", "POST /v1/realtime/sdp HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\n" +
			"Content-Length: " + strconv.Itoa(len(offer)) + "\r\n\r\n" + offer[:len(offer)/2], http.StatusRequestTimeout},
		{"stalled chunked body", "POST /v1/realtime/calls HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\n" +
			"Transfer-Encoding: chunked\r\n\r\n10\r\nv=0\r\no=- 1 1 IN \r\n", http.StatusRequestTimeout},
		{"stalled headers", "POST /v1/realtime/sdp HTTP/1.1\r\nHost: x\r\nContent-Type: appl", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, tc.send); err != nil {
				t.Fatal(err)
			}
			// A safety net only: the server must end it long before.
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			if tc.status == 0 {
				if n, err := br.Read(make([]byte, 1)); err != io.EOF && !isReset(err) {
					t.Fatalf("stalled headers: read %d bytes, err %v; want the connection closed", n, err)
				}
			} else {
				res, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("no response: %v", err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				wantAPIError(t, res, body, tc.status, "request_timeout")
				if _, err := br.ReadByte(); err != io.EOF && !isReset(err) {
					t.Errorf("connection still open after the 408: %v", err)
				}
			}
			t.Logf("%s: cut off after %v (header timeout %v, request timeout %v)",
				tc.name, time.Since(start).Round(time.Millisecond), headerTimeout, readTimeout)
		})
	}
	for id, p := range w.pods {
		if n := p.created(t); n != 0 {
			t.Errorf("cluster %d created %v sessions for stalled requests", id, n)
		}
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}
