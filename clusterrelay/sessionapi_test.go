package clusterrelay

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// TestFrontSecret: with a cluster secret the front refuses callers without
// it and presents it to the pods (which a pod with the same secret
// requires).
func TestFrontSecret(t *testing.T) {
	const secret = "cluster-7-session-api-secret"
	id, _ := sessionid.New(7, 1)
	pod := httptest.NewServer(sessionapi.RequireSecretHash(sessionapi.SecretHash(secret), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"` + id.String() + `","answer":"v=0"}`))
	})))
	defer pod.Close()
	dir := NewDirectory()
	dir.SetPods([]PodInfo{{ID: 1, API: pod.URL, Capacity: 10}})
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	tests := []struct {
		name        string
		frontSecret string
		auth        string
		want        int
	}{
		{"caller without the secret", secret, "", http.StatusUnauthorized},
		{"caller with another cluster's secret", secret, "Bearer cluster-8-session-api-secret", http.StatusUnauthorized},
		{"caller with the secret", secret, "Bearer " + secret, http.StatusCreated},
		// A front that does not present the secret is refused by the pod
		// and finds no pod to take the session.
		{"front without the secret", "", "", http.StatusServiceUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFront(FrontConfig{Cluster: 7, Pods: dir, Secret: tc.frontSecret, HTTPClient: client, Logger: quiet})
			srv := httptest.NewServer(f.Handler())
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+sessionapi.SessionsPath, strings.NewReader(`{"offer":"v=0","pops":[]}`))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}
