package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testsdp"
)

// TestCreateDeleteRoundsNeverFail: 200 rounds of create and delete through
// signaling on the dev world (loopback gossip timings) on a machine other
// engineers load too. Gossip may flap under that load (the members it
// declared dead are counted and reported), but no request may fail for it:
// every create is answered 201 and every delete 204.
func TestCreateDeleteRoundsNeverFail(t *testing.T) {
	const rounds = 200
	w := startWorld(t, devworld.Config{})
	offer := testsdp.Offer(t)
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	deaths := func() float64 { return metricSum(t, w.Registry, "rtcedge_membership_deaths_total", nil) }
	deathsBefore := deaths()
	failures := map[string]int{}
	start := time.Now()
	for i := 0; i < rounds && time.Since(start) < 3*time.Minute; i++ {
		resp, err := client.Post(w.SignalingURL+"/v1/realtime/sdp", "application/sdp", strings.NewReader(offer))
		if err != nil {
			failures["create: "+err.Error()]++
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusCreated || loc == "" {
			failures["create: "+resp.Status+" "+strings.TrimSpace(string(body))]++
			continue
		}
		req, _ := http.NewRequest(http.MethodDelete, w.SignalingURL+loc, nil)
		resp, err = client.Do(req)
		if err != nil {
			failures["delete: "+err.Error()]++
			continue
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			failures["delete: "+resp.Status+" "+strings.TrimSpace(string(body))]++
		}
	}
	t.Logf("%d create/delete rounds in %v: %d members declared dead meanwhile; failures %v",
		rounds, time.Since(start).Round(time.Millisecond), int(deaths()-deathsBefore), failures)
	if len(failures) > 0 {
		t.Errorf("requests failed: %v", failures)
	}
}
