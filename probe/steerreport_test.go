package probe_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rtcedge/rtcedge/probe"
)

// TestReportRTT: a call's echo RTT goes to the samples endpoint with the
// probe's credential; a refusal is an error; a report without a POP is
// not sent.
func TestReportRTT(t *testing.T) {
	var got struct {
		Samples []struct {
			POP   string  `json:"pop"`
			RTTMs float64 `json:"rtt_ms"`
		} `json:"samples"`
	}
	status, posts := http.StatusAccepted, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts++
		if r.URL.Path != probe.SamplesPath || r.Header.Get("Authorization") != "Bearer probe-key" {
			t.Errorf("%s %s auth %q", r.Method, r.URL.Path, r.Header.Get("Authorization"))
		}
		_ = json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(status)
	}))
	defer srv.Close()
	cfg := probe.Config{SignalingURL: srv.URL, Token: "probe-key", HTTPClient: srv.Client()}
	if err := probe.ReportRTT(t.Context(), cfg, probe.Report{POP: "fra", RTTP50Ms: 21.5}); err != nil {
		t.Fatal(err)
	}
	if len(got.Samples) != 1 || got.Samples[0].POP != "fra" || got.Samples[0].RTTMs != 21.5 {
		t.Fatalf("posted %+v", got)
	}
	status = http.StatusForbidden
	if err := probe.ReportRTT(t.Context(), cfg, probe.Report{POP: "fra", RTTP50Ms: 21.5}); err == nil {
		t.Error("a refused report is no error")
	}
	if err := probe.ReportRTT(t.Context(), cfg, probe.Report{RTTP50Ms: 21.5}); err != nil || posts != 2 {
		t.Errorf("a report without a POP: %v, %d posts", err, posts)
	}
}
