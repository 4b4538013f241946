package clusterrelay

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// TestFrontSpreadsBursts: concurrent creates while gossip still reports
// the pods' old loads (it never catches up during the test) spread within
// ±10 % of even across the ready pods. Without the front counting its own
// placements, every create of a burst goes to the pod whose stale load
// looks lowest (4 → 4/0, 200 → 200/0 with two pods).
func TestFrontSpreadsBursts(t *testing.T) {
	tests := []struct {
		name    string
		loads   []int // stale gossiped load per pod
		creates int
	}{
		{"2 pods, 4 creates", []int{0, 0}, 4},
		{"2 pods, 12 creates", []int{3, 3}, 12},
		{"2 pods, 200 creates, one looks lighter", []int{0, 1}, 200},
		{"4 pods, 200 creates, one looks lighter", []int{0, 1, 1, 1}, 200},
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var infos []PodInfo
			counts := make([]atomic.Int64, len(tc.loads))
			for i, load := range tc.loads {
				id, _ := sessionid.New(7, uint16(i+1))
				pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					counts[i].Add(1)
					time.Sleep(20 * time.Millisecond) // creates overlap, as real ones (≈ 10–50 ms) do
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, `{"id":%q,"answer":"v=0"}`, id.String())
				}))
				defer pod.Close()
				infos = append(infos, PodInfo{ID: uint16(i + 1), API: pod.URL, Load: load, Capacity: 1000})
			}
			dir := NewDirectory()
			dir.SetPods(infos)
			f := NewFront(FrontConfig{Cluster: 7, Pods: dir, HTTPClient: client, Logger: quiet, Timeout: 10 * time.Second})
			srv := httptest.NewServer(f.Handler())
			defer srv.Close()

			var wg sync.WaitGroup
			var failed atomic.Int64
			start := make(chan struct{})
			for range tc.creates {
				wg.Go(func() {
					<-start
					resp, err := client.Post(srv.URL+sessionapi.SessionsPath, "application/json", strings.NewReader(`{"offer":"v=0","pops":[]}`))
					if err != nil {
						failed.Add(1)
						return
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						failed.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if n := failed.Load(); n > 0 {
				t.Fatalf("%d of %d creates failed", n, tc.creates)
			}
			even := float64(tc.creates) / float64(len(tc.loads))
			var got []int64
			for i := range counts {
				got = append(got, counts[i].Load())
			}
			t.Logf("%d concurrent creates over %d pods: %v (even %.1f)", tc.creates, len(tc.loads), got, even)
			for i, n := range got {
				if d := float64(n) - even; d > 0.1*even || d < -0.1*even {
					t.Errorf("pod %d got %d creates, want %.1f ± 10 %% (all: %v)", i+1, n, even, got)
				}
			}
		})
	}
}

// TestPlacerForgetsWhatGossipShows: the front's own placements count until
// a gossiped load that changed GossipLag after them, or until
// PlacementHold; they are never counted twice.
func TestPlacerForgetsWhatGossipShows(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	pl := newPlacer(time.Second, 5*time.Second, clock)
	pods := func(load int) []PodInfo { return []PodInfo{{ID: 1, API: "a", Load: load, Capacity: 100}} }
	// see lets the placer read gossip's load through a refused create.
	see := func(load int) {
		pl.pick(pods(load), 1)
		pl.done(1, false)
	}

	for range 3 {
		if got := pl.pick(pods(10), 1); len(got) != 1 {
			t.Fatalf("picked %d pods, want 1", len(got))
		}
	}
	if got := pl.load(1); got != 13 {
		t.Fatalf("three creates in flight: load %d, want 13", got)
	}
	pl.done(1, true)
	pl.done(1, true)
	pl.done(1, false) // refused: not counted
	if got := pl.load(1); got != 12 {
		t.Fatalf("two created, one refused: load %d, want 12", got)
	}

	// Then gossip reports a load after some time: what the front assumes.
	steps := []struct {
		what     string
		after    time.Duration
		create   bool // the front places one more session first
		gossip   int
		wantLoad int
	}{
		{"gossip changed 500 ms after the creates (may predate them)", 500 * time.Millisecond, false, 11, 13},
		{"gossip changed 1.5 s after the creates (includes them)", time.Second, false, 12, 12},
		{"4 s after a create, gossip unchanged", 4 * time.Second, true, 12, 13},
		{"6 s after a create, gossip unchanged (PlacementHold)", 2 * time.Second, false, 12, 12},
	}
	for _, st := range steps {
		if st.create {
			pl.pick(pods(st.gossip), 1)
			pl.done(1, true)
		}
		now = now.Add(st.after)
		see(st.gossip)
		if got := pl.load(1); got != st.wantLoad {
			t.Errorf("%s: load %d, want %d", st.what, got, st.wantLoad)
		}
	}

	// A pod gone from gossip is forgotten.
	pl.pick(nil, 1)
	if got := pl.load(1); got != 0 {
		t.Errorf("pod gone: load %d, want 0", got)
	}
}

// TestFrontReachesPodGossipJustDropped: when gossip drops a pod for a
// moment (a flap under load), a hang-up naming one of its sessions still
// reaches it; a pod that is really gone gives 404, as before.
func TestFrontReachesPodGossipJustDropped(t *testing.T) {
	id, _ := sessionid.New(7, 1)
	var deletes atomic.Int64
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deletes.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer pod.Close()
	dir := NewDirectory()
	dir.SetPods([]PodInfo{{ID: 1, API: pod.URL, Capacity: 10}})
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	f := NewFront(FrontConfig{Cluster: 7, Pods: dir, HTTPClient: client, Logger: quiet})
	srv := httptest.NewServer(f.Handler())
	defer srv.Close()
	del := func() int {
		req, _ := http.NewRequest(http.MethodDelete, srv.URL+sessionapi.SessionsPath+"/"+id.String(), nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := del(); code != http.StatusNoContent {
		t.Fatalf("delete with the pod listed: %d", code)
	}
	dir.SetPods(nil) // gossip flapped
	if code := del(); code != http.StatusNoContent || deletes.Load() != 2 {
		t.Fatalf("delete while gossip briefly lists no pod: %d, pod saw %d deletes; want 204 from the pod", code, deletes.Load())
	}
	pod.Close() // now it is really gone
	if code := del(); code != http.StatusNotFound {
		t.Errorf("delete for a pod that is gone: %d, want 404", code)
	}
}

// load returns the load the front assumes for pod: gossip's plus its own.
func (pl *placer) load(pod uint16) int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	st := pl.pods[pod]
	if st == nil {
		return 0
	}
	return st.gossipLoad + st.inflight + len(st.placed)
}
