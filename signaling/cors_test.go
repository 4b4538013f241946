package signaling_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/signaling"
)

// TestCORSAllowsICERestart: a page on an allowed origin can restart ICE by
// PATCH of its session URL (RFC 9725): the preflight allows PATCH and the
// If-Match header, answers expose ETag and Location; another origin gets
// no CORS headers at all.
func TestCORSAllowsICERestart(t *testing.T) {
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) { c.CORSOrigins = []string{"https://app.example"} }})
	preflight := http.Header{"Origin": {"https://app.example"}, "Access-Control-Request-Method": {"PATCH"},
		"Access-Control-Request-Headers": {"authorization,content-type,if-match"}}
	for _, path := range []string{"/v1/realtime/calls/abc", "/v1/realtime/sessions/abc"} {
		res := w.do(t, http.MethodOptions, path, "127.0.0.1", "", "", preflight)
		h := res.Header()
		if res.Code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://app.example" {
			t.Fatalf("OPTIONS %s = %d, Allow-Origin %q", path, res.Code, h.Get("Access-Control-Allow-Origin"))
		}
		if m := h.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "PATCH") || !strings.Contains(m, "DELETE") {
			t.Errorf("OPTIONS %s: Allow-Methods %q, want PATCH and DELETE", path, m)
		}
		if a := strings.ToLower(h.Get("Access-Control-Allow-Headers")); !strings.Contains(a, "if-match") || !strings.Contains(a, "authorization") {
			t.Errorf("OPTIONS %s: Allow-Headers %q, want If-Match and Authorization", path, a)
		}
	}
	res := w.do(t, http.MethodPatch, "/v1/realtime/calls/abc", "127.0.0.1", "application/trickle-ice-sdpfrag",
		"a=ice-ufrag:abcd\r\na=ice-pwd:0123456789012345678901\r\n", http.Header{"Origin": {"https://app.example"}, "If-Match": {"*"}})
	if e := res.Header().Get("Access-Control-Expose-Headers"); !strings.Contains(e, "ETag") || !strings.Contains(e, "Location") {
		t.Errorf("PATCH: Expose-Headers %q, want ETag and Location", e)
	}
	res = w.do(t, http.MethodOptions, "/v1/realtime/calls/abc", "127.0.0.1", "", "",
		http.Header{"Origin": {"https://evil.example"}, "Access-Control-Request-Method": {"PATCH"}})
	if o := res.Header().Get("Access-Control-Allow-Origin"); o != "" {
		t.Errorf("another origin got Allow-Origin %q", o)
	}
}

// TestCORSAllowsOpenAISDKHeaders: a page on an allowed origin using
// OpenAI's JavaScript SDKs passes the preflight of every endpoint it
// calls. The Agents SDK's WebRTC transport sends X-OpenAI-Agents-SDK with
// its offer; the openai client sends its X-Stainless-* headers, OpenAI-Beta
// and, when configured, OpenAI-Organization and OpenAI-Project. The answer
// exposes what the SDKs read: Location (the call ID) and Retry-After.
func TestCORSAllowsOpenAISDKHeaders(t *testing.T) {
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) { c.CORSOrigins = []string{"http://127.0.0.5:3000"} }})
	sdk := []string{"authorization", "content-type", "x-openai-agents-sdk", "openai-beta", "openai-organization", "openai-project",
		"x-stainless-lang", "x-stainless-package-version", "x-stainless-os", "x-stainless-arch", "x-stainless-runtime",
		"x-stainless-runtime-version", "x-stainless-retry-count", "x-stainless-timeout", "x-stainless-helper-method"}
	for _, path := range []string{"/v1/realtime/calls", "/v1/realtime/client_secrets", "/v1/realtime/calls/abc/hangup"} {
		res := w.do(t, http.MethodOptions, path, "127.0.0.1", "", "", http.Header{"Origin": {"http://127.0.0.5:3000"},
			"Access-Control-Request-Method": {"POST"}, "Access-Control-Request-Headers": {strings.Join(sdk, ",")}})
		if res.Code != http.StatusNoContent {
			t.Fatalf("OPTIONS %s = %d", path, res.Code)
		}
		allowed := map[string]bool{}
		for _, h := range strings.Split(res.Header().Get("Access-Control-Allow-Headers"), ",") {
			allowed[strings.ToLower(strings.TrimSpace(h))] = true
		}
		for _, h := range sdk {
			if !allowed[h] {
				t.Errorf("OPTIONS %s: %s is not in Allow-Headers %q", path, h, res.Header().Get("Access-Control-Allow-Headers"))
			}
		}
		expose := strings.ToLower(res.Header().Get("Access-Control-Expose-Headers"))
		for _, h := range []string{"location", "retry-after"} {
			if !strings.Contains(expose, h) {
				t.Errorf("OPTIONS %s: Expose-Headers %q lacks %s", path, expose, h)
			}
		}
	}
}
