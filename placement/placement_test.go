package placement_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/placement"
)

// clusterAPI answers creates with status (201: a session of cluster id)
// and counts them.
func clusterAPI(t *testing.T, id uint16, status int, code string) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		var req sessionapi.CreateRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.POPs) == 0 {
			http.Error(w, "bad create", http.StatusInternalServerError)
			return
		}
		if status != http.StatusCreated {
			apierr.Write(w, status, apierr.TypeInvalidRequest, code, "no", 0)
			return
		}
		sid, _ := sessionid.New(id, 1)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(sessionapi.CreateResponse{ID: sid.String(), Answer: "v=0", Cluster: id, Pod: 1})
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func newPlacer(t *testing.T, apis ...string) (*placement.Placer, placement.Metrics, *geo.Catalogue) {
	t.Helper()
	cat := &geo.Catalogue{DefaultRegion: "a"}
	for i, api := range apis {
		id := uint16(i + 1)
		loc := geo.Point{Lat: float64(10 * i), Lon: 0}
		cat.Regions = append(cat.Regions, geo.Region{Name: string(rune('a' + i)), Location: loc,
			Clusters: []geo.Cluster{{ID: id, Name: "c" + string(rune('a'+i)), Location: loc, SessionAPI: api}},
			POPs:     []geo.POP{{ID: id, Name: "pop" + string(rune('a'+i)), VIP: netipPort(id), Location: loc}}})
	}
	if err := cat.Validate(); err != nil {
		t.Fatal(err)
	}
	m, _ := placement.NewMetrics("test", cat)
	p, err := placement.New(placement.Config{Catalogue: cat, Clusters: &placement.Clusters{HTTPClient: http.DefaultClient, Timeout: 2 * time.Second},
		MaxAttempts: 3, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return p, m, cat
}

func TestPlaceNearestFirstThenNext(t *testing.T) {
	full, nFull := clusterAPI(t, 1, http.StatusServiceUnavailable, "full")
	ok, nOK := clusterAPI(t, 2, http.StatusCreated, "")
	p, m, _ := newPlacer(t, full.URL, ok.URL)
	res, err := p.Place(context.Background(), placement.Request{Loc: geo.Location{Source: geo.SourceDefault}, What: "offer",
		Create: sessionapi.CreateRequest{Offer: "v=0"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cluster.ID != 2 || res.Attempt != 2 || nFull.Load() != 1 || nOK.Load() != 1 {
		t.Fatalf("placed on %d at attempt %d (creates %d, %d)", res.Cluster.ID, res.Attempt, nFull.Load(), nOK.Load())
	}
	if got := testutil.ToFloat64(m.Attempts.WithLabelValues("1", "unavailable")); got != 1 {
		t.Fatalf("unavailable attempts %v", got)
	}
}

func TestPlaceErrors(t *testing.T) {
	rejecting, _ := clusterAPI(t, 1, http.StatusBadRequest, sessionapi.CodeUnsupportedKind)
	other, nOther := clusterAPI(t, 2, http.StatusCreated, "")
	p, _, _ := newPlacer(t, rejecting.URL, other.URL)
	_, err := p.Place(context.Background(), placement.Request{Create: sessionapi.CreateRequest{Kind: sessionapi.KindRTP, Offer: "v=0"}})
	var rej *placement.RejectedError
	if !errors.As(err, &rej) || nOther.Load() != 0 {
		t.Fatalf("a pod's refusal of the offer: %v, %d creates elsewhere; want a RejectedError and none", err, nOther.Load())
	}

	full, _ := clusterAPI(t, 1, http.StatusServiceUnavailable, "full")
	p, m, _ := newPlacer(t, full.URL)
	if _, err := p.Place(context.Background(), placement.Request{Create: sessionapi.CreateRequest{Offer: "v=0"}}); !errors.Is(err, placement.ErrNoCapacity) {
		t.Fatalf("every cluster full: %v", err)
	}
	if got := testutil.ToFloat64(m.NoCapacity); got != 1 {
		t.Fatalf("no capacity counted %v", got)
	}

	huge := make([]byte, sessionapi.MaxRequestBody)
	var tl *placement.TooLargeError
	if _, err := p.Place(context.Background(), placement.Request{What: "SDP", Create: sessionapi.CreateRequest{Offer: string(huge)}}); !errors.As(err, &tl) || tl.What != "SDP" {
		t.Fatalf("oversized: %v", err)
	}
}

func TestPlacePin(t *testing.T) {
	a, _ := clusterAPI(t, 1, http.StatusCreated, "")
	b, _ := clusterAPI(t, 2, http.StatusCreated, "")
	p, _, cat := newPlacer(t, a.URL, b.URL)
	pin, _ := cat.POP(2)
	res, err := p.Place(context.Background(), placement.Request{Pin: []geo.POP{pin}, Create: sessionapi.CreateRequest{Offer: "v=0"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.POPs) != 1 || res.POPs[0].ID != 2 || res.Reason != placement.ReasonOverride {
		t.Fatalf("pinned POP 2, got %+v (%s)", res.POPs, res.Reason)
	}
}

func netipPort(id uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, byte(id + 1)}), 3478)
}
