package sessionapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// The wire form is what pods written before this package expect: the VIP
// as an "ip:port" string, config as a raw JSON object, omitted when empty.
func TestCreateRequestWireForm(t *testing.T) {
	tests := []struct {
		name string
		req  CreateRequest
		want string
	}{
		{"no config", CreateRequest{Offer: "v=0", POPs: []POP{{ID: 7, VIP: netip.MustParseAddrPort("203.0.113.10:3478")}}},
			`{"offer":"v=0","pops":[{"id":7,"vip":"203.0.113.10:3478"}]}`},
		{"config", CreateRequest{Offer: "v=0", POPs: []POP{{ID: 1, VIP: netip.MustParseAddrPort("[2001:db8::1]:3478")}}, Config: json.RawMessage(`{"model":"m"}`)},
			`{"offer":"v=0","pops":[{"id":1,"vip":"[2001:db8::1]:3478"}],"config":{"model":"m"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("got %s\nwant %s", b, tc.want)
			}
			var back CreateRequest
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back.POPs[0] != tc.req.POPs[0] || string(back.Config) != string(tc.req.Config) {
				t.Fatalf("round trip: %+v", back)
			}
		})
	}
}

func TestRequireSecret(t *testing.T) {
	inner := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	for _, h := range []http.Handler{RequireSecret("s3cret-of-cluster-1", inner), RequireSecretHash(SecretHash("s3cret-of-cluster-1"), inner)} {
		checkRequireSecret(t, h)
	}
	// A malformed hash (a typo in the config) opens nothing.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, SessionsPath, nil)
	Authorize(req, "s3cret-of-cluster-1")
	RequireSecretHash("not-hex", inner).ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("malformed hash: %d, want 401", rec.Code)
	}
}

func checkRequireSecret(t *testing.T, h http.Handler) {
	t.Helper()
	tests := []struct {
		name, path, auth string
		want             int
	}{
		{"no credentials", SessionsPath, "", http.StatusUnauthorized},
		{"wrong secret", SessionsPath, "Bearer s3cret-of-cluster-2", http.StatusUnauthorized},
		{"secret without scheme", SessionsPath, "s3cret-of-cluster-1", http.StatusUnauthorized},
		{"prefix of the secret", StatusPath, "Bearer s3cret", http.StatusUnauthorized},
		{"right secret", SessionsPath, "Bearer s3cret-of-cluster-1", http.StatusTeapot},
		{"status with the secret", StatusPath, "Bearer s3cret-of-cluster-1", http.StatusTeapot},
		{"liveness probe", "/livez", "", http.StatusTeapot},
		{"readiness probe", "/readyz", "", http.StatusTeapot},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("status %d, want %d", rec.Code, tc.want)
			}
		})
	}
	// Authorize produces what RequireSecret accepts.
	req := httptest.NewRequest(http.MethodPost, SessionsPath, nil)
	Authorize(req, "s3cret-of-cluster-1")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusTeapot {
		t.Fatalf("Authorize: status %d", rec.Code)
	}
}
