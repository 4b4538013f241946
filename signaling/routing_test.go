package signaling_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/signaling"
)

// placement is where signaling put a call, as its response says.
type placement struct {
	region, cluster, pop, backup string
}

func placementOf(h http.Header) placement {
	return placement{h.Get(signaling.HeaderRegion), h.Get(signaling.HeaderCluster), h.Get(signaling.HeaderPOP), h.Get(signaling.HeaderBackupPOP)}
}

var (
	inFrankfurt = placement{"eu-central", "1", "fra", "iad"}
	inAshburn   = placement{"us-east", "2", "iad", "fra"}
	inSingapore = placement{"ap-southeast", "3", "sin", "fra"}
)

func vipOf(pop string) netip.AddrPort {
	for _, r := range testRegions {
		if r.popName == pop {
			return r.vip
		}
	}
	return netip.AddrPort{}
}

// checkPlaced checks a 201: the placement headers, a Location naming the
// chosen cluster, and an answer advertising exactly the nearest and backup
// POP VIPs, the backup at a lower priority.
func checkPlaced(t *testing.T, res *http.Response, body []byte, want placement) {
	t.Helper()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201: %s", res.StatusCode, body)
	}
	if got := placementOf(res.Header); got != want {
		t.Errorf("placed at %+v, want %+v", got, want)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/sdp" {
		t.Errorf("Content-Type %q", ct)
	}
	loc := res.Header.Get("Location")
	id, err := signaling.SessionOf(loc[strings.LastIndexByte(loc, '/')+1:])
	if err != nil {
		t.Errorf("Location %q: %v", res.Header.Get("Location"), err)
	} else if got := id.Cluster; want.cluster != "" && itoa(got) != want.cluster {
		t.Errorf("session ID names cluster %d, want %s", got, want.cluster)
	}
	prios := testsdp.CandidatePriorities(t, string(body))
	nearest, backup := vipOf(want.pop), vipOf(want.backup)
	if len(prios) != 2 || prios[nearest] == 0 || prios[backup] == 0 {
		t.Fatalf("answer candidates %v, want %v and %v", prios, nearest, backup)
	}
	if prios[backup] >= prios[nearest] {
		t.Errorf("backup POP priority %d is not below the nearest POP's %d", prios[backup], prios[nearest])
	}
}

func itoa(v uint16) string { return strconv.Itoa(int(v)) }

// TestSignalingGeoRouting places offers from fixture addresses of every
// region, directly and through proxies, on real pods, and checks the
// cluster, the POP and the backup POP chosen.
func TestSignalingGeoRouting(t *testing.T) {
	w := newWorld(t, worldConfig{proxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	offer := testsdp.Offer(t)
	const proxy = "10.1.2.3"
	tests := []struct {
		name string
		peer string
		hdr  http.Header
		want placement
	}{
		{"frankfurt by GeoIP", ipFrankfurt, nil, inFrankfurt},
		{"ashburn by GeoIP", ipAshburn, nil, inAshburn},
		{"singapore by GeoIP", ipSingapore, nil, inSingapore},
		{"singapore IPv6 by GeoIP", "2001:db8:3::1", nil, inSingapore},
		{"ashburn IPv6 by GeoIP", "2001:db8:2::42", nil, inAshburn},
		{"loopback goes to the default region", "127.0.0.1", nil, inFrankfurt},
		{"unknown public address goes to the default region", "8.8.8.8", nil, inFrankfurt},
		{"untrusted peer: forwarded headers ignored", ipAshburn, http.Header{
			"X-Forwarded-For": {ipSingapore}, "Cf-Connecting-Ip": {ipSingapore},
			"Cf-Iplatitude": {"1.35"}, "Cf-Iplongitude": {"103.82"},
		}, inAshburn},
		{"trusted proxy: X-Forwarded-For", proxy, http.Header{"X-Forwarded-For": {ipSingapore}}, inSingapore},
		{"trusted proxy: right-most X-Forwarded-For wins over a forged left entry", proxy,
			http.Header{"X-Forwarded-For": {ipAshburn + ", " + ipSingapore}}, inSingapore},
		{"trusted proxy: CF-Connecting-IP", proxy, http.Header{"Cf-Connecting-Ip": {ipAshburn}}, inAshburn},
		{"trusted proxy: CF coordinates", proxy, http.Header{
			"Cf-Connecting-Ip": {ipAshburn}, "Cf-Iplatitude": {"1.29"}, "Cf-Iplongitude": {"103.85"},
		}, inSingapore},
		{"trusted proxy without headers: the proxy itself (default region)", proxy, nil, inFrankfurt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", tc.peer, "application/sdp", offer, tc.hdr)
			res, body := recorded(rec)
			checkPlaced(t, res, body, tc.want)
			w.hangup(t, rec, nil)
		})
	}
	for id, p := range w.pods {
		if n := p.tr.Sessions(); n != 0 {
			t.Errorf("cluster %d holds %d sessions after every call was hung up", id, n)
		}
	}
}

// TestSignalingTrustedProxy runs the same request through real HTTP
// servers: with loopback as a trusted proxy the client is located by
// X-Forwarded-For, without it by its own (loopback) address.
func TestSignalingTrustedProxy(t *testing.T) {
	offer := testsdp.Offer(t)
	tests := []struct {
		name    string
		proxies []netip.Prefix
		want    placement
	}{
		{"trusted", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, inSingapore},
		{"untrusted", nil, inFrankfurt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, worldConfig{proxies: tc.proxies})
			base := serve(t, w.h)
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/realtime/sdp", strings.NewReader(offer))
			req.Header.Set("Content-Type", "application/sdp")
			req.Header.Set("X-Forwarded-For", ipSingapore)
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			checkPlaced(t, res, body, tc.want)
			del, _ := http.NewRequest(http.MethodDelete, base+res.Header.Get("Location"), nil)
			if res, err := client.Do(del); err != nil || res.StatusCode != http.StatusNoContent {
				t.Errorf("DELETE: %v %v", res, err)
			} else {
				res.Body.Close()
			}
		})
	}
}

// TestSignalingSkipsUnusableClusters feeds cluster states through
// Config.Health: an unhealthy, draining or full nearest cluster is passed
// over for the next-nearest, one gossip has not heard of is used, a POP
// that is down is not advertised, and with nothing usable the answer is
// 503 with Retry-After. GET /v1/regions shows the same states.
func TestSignalingSkipsUnusableClusters(t *testing.T) {
	offer := testsdp.Offer(t)
	tests := []struct {
		name   string
		health map[uint16]geo.ClusterState
		popUp  func(uint16) bool
		want   placement // zero: 503
	}{
		{"all healthy", map[uint16]geo.ClusterState{1: {Healthy: true, Load: 3, Capacity: 10}}, nil, inFrankfurt},
		{"nearest unhealthy", map[uint16]geo.ClusterState{1: {Healthy: false}}, nil,
			placement{"us-east", "2", "fra", "iad"}},
		{"nearest draining", map[uint16]geo.ClusterState{1: {Healthy: true, Draining: true}}, nil,
			placement{"us-east", "2", "fra", "iad"}},
		{"nearest full", map[uint16]geo.ClusterState{1: {Healthy: true, Load: 10, Capacity: 10}}, nil,
			placement{"us-east", "2", "fra", "iad"}},
		{"two nearest full", map[uint16]geo.ClusterState{
			1: {Healthy: true, Load: 10, Capacity: 10}, 2: {Healthy: true, Load: 5, Capacity: 5},
		}, nil, placement{"ap-southeast", "3", "fra", "iad"}},
		{"nearest POP down", nil, func(id uint16) bool { return id != 1 }, placement{"eu-central", "1", "iad", "sin"}},
		// Gossip's down verdict may be wrong (a member not learned yet, a
		// slow one declared dead): with one POP up the answer still
		// carries a backup, the nearest of the others.
		{"only the nearest POP up", nil, func(id uint16) bool { return id == 1 }, placement{"eu-central", "1", "fra", "iad"}},
		{"only the farthest POP up", nil, func(id uint16) bool { return id == 3 }, placement{"eu-central", "1", "sin", "fra"}},
		{"nothing usable", map[uint16]geo.ClusterState{1: {}, 2: {}, 3: {Healthy: true, Draining: true}}, nil, placement{}},
		{"no POP up", nil, func(uint16) bool { return false }, placement{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
				c.Health = func(id uint16) (geo.ClusterState, bool) {
					st, ok := tc.health[id]
					return st, ok
				}
				c.POPUp = tc.popUp
			}})
			rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", ipFrankfurt, "application/sdp", offer, nil)
			w.wantPlaced(t, rec, tc.want)
			for id, p := range w.pods {
				if c := p.created(t); itoa(id) != tc.want.cluster && c != 0 {
					t.Errorf("cluster %d created %v sessions, want none", id, c)
				}
			}

			// The regions view agrees with gossip.
			res, body := recorded(w.do(t, http.MethodGet, "/v1/regions", "127.0.0.1", "", "", nil))
			var regions signaling.RegionsResponse
			if err := json.Unmarshal(body, &regions); err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("GET /v1/regions: %d %s %v", res.StatusCode, body, err)
			}
			if len(regions.Regions) != 3 || regions.DefaultRegion != "eu-central" {
				t.Fatalf("regions %+v", regions)
			}
			for _, rg := range regions.Regions {
				for _, c := range rg.Clusters {
					st, known := tc.health[c.ID]
					if !known {
						st.Healthy = true
					}
					if c.Known != known || c.Healthy != st.Healthy || c.Draining != st.Draining || c.Load != st.Load || c.Capacity != st.Capacity {
						t.Errorf("region %s cluster %d shown as %+v, gossip says %+v (known %v)", rg.Name, c.ID, c, st, known)
					}
				}
				for _, p := range rg.POPs {
					if up := tc.popUp == nil || tc.popUp(p.ID); p.Up != up {
						t.Errorf("POP %s shown up=%v, want %v", p.Name, p.Up, up)
					}
				}
			}
		})
	}
}

// TestSignalingFallThrough makes the nearest cluster's session API fail in
// every way a cluster can (refusing connections, hanging, full, erroring,
// answering nonsense) and checks the offer lands on the next-nearest real
// pod within the per-cluster bound; with every cluster failing the client
// gets one 503 with Retry-After.
func TestSignalingFallThrough(t *testing.T) {
	offer := testsdp.Offer(t)
	refused := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close()
		return url
	}
	// fault serves h as a misbehaving session API.
	fault := func(h http.HandlerFunc) func(t *testing.T) string {
		return func(t *testing.T) string {
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			return srv.URL
		}
	}
	hanging := fault(func(w http.ResponseWriter, r *http.Request) {
		// Read the offer, then answer nothing until signaling gives up.
		// (The server notices the closed connection only once the body
		// has been read.)
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	})
	full := fault(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"type":"service_unavailable_error","code":"no_capacity","message":"pod is at capacity"}}`)
	})
	broken := fault(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "internal error", http.StatusInternalServerError)
	})
	wrongPath := fault(func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	// A pod refusing what signaling sent it rather than the offer: a
	// fault on our side, for the next cluster to make up for.
	badPOPs := fault(func(w http.ResponseWriter, r *http.Request) {
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_pops", "pop 1: no such VIP here", 0)
	})
	garbage := fault(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "<html>created</html>")
	})
	forgedID := fault(func(w http.ResponseWriter, r *http.Request) {
		// A 201 whose session ID names another cluster: a DELETE would go
		// astray, so it must not be handed out.
		id, _ := sessionid.New(2, 1)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"id": id.String(), "answer": "v=0\r\n"})
	})

	tests := []struct {
		name   string
		faults map[uint16]func(*testing.T) string
		result string // the nearest cluster's attempt result
		want   placement
	}{
		{"refused", map[uint16]func(*testing.T) string{1: refused}, "error", inAshburnFromFrankfurt},
		{"hanging", map[uint16]func(*testing.T) string{1: hanging}, "timeout", inAshburnFromFrankfurt},
		{"503 full", map[uint16]func(*testing.T) string{1: full}, "unavailable", inAshburnFromFrankfurt},
		{"500", map[uint16]func(*testing.T) string{1: broken}, "server_error", inAshburnFromFrankfurt},
		{"400 invalid_pops", map[uint16]func(*testing.T) string{1: badPOPs}, "server_error", inAshburnFromFrankfurt},
		{"404 not JSON", map[uint16]func(*testing.T) string{1: wrongPath}, "bad_answer", inAshburnFromFrankfurt},
		{"201 garbage", map[uint16]func(*testing.T) string{1: garbage}, "bad_answer", inAshburnFromFrankfurt},
		{"201 with a foreign session ID", map[uint16]func(*testing.T) string{1: forgedID}, "bad_answer", inAshburnFromFrankfurt},
		{"two nearest down", map[uint16]func(*testing.T) string{1: refused, 2: full}, "error",
			placement{"ap-southeast", "3", "fra", "iad"}},
		{"all down", map[uint16]func(*testing.T) string{1: refused, 2: hanging, 3: full}, "error", placement{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api := map[uint16]string{}
			for id, f := range tc.faults {
				api[id] = f(t)
			}
			w := newWorld(t, worldConfig{api: api})
			start := time.Now()
			rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", ipFrankfurt, "application/sdp", offer, nil)
			elapsed := time.Since(start)
			w.wantPlaced(t, rec, tc.want)
			if got := metricValue(t, w, "rtcedge_signaling_cluster_attempts_total", map[string]string{"cluster": "1", "result": tc.result}); got != 1 {
				t.Errorf("cluster 1 attempts with result %q = %v, want 1", tc.result, got)
			}
			t.Logf("%s: answer after %v (bound per cluster: %v)", tc.name, elapsed.Round(time.Millisecond), 2*time.Second)
		})
	}
}

var inAshburnFromFrankfurt = placement{"us-east", "2", "fra", "iad"}

// metricValue sums the samples of a signaling metric matching labels.
func metricValue(t *testing.T, w *world, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// TestSignalingOfferEncodedSize: an offer under the body cap stays under
// the session API's once encoded. Characters HTML-escaping JSON makes six
// bytes of ('<', '>', '&') once turned a 21 KB offer into a 503, after
// three clusters had each refused it as too large; control characters,
// which JSON must escape so, get a 413 here instead of the same tour.
func TestSignalingOfferEncodedSize(t *testing.T) {
	w := newWorld(t, worldConfig{})
	offer := testsdp.Offer(t)
	padded := offer + "a=x-pad:" + strings.Repeat("<&>", 7000) + "\r\n"
	rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", ipFrankfurt, "application/sdp", padded, nil)
	res, body := recorded(rec)
	checkPlaced(t, res, body, inFrankfurt)
	w.hangup(t, rec, nil)

	ctl := offer + "a=x-pad:" + strings.Repeat("\x01", 20000) + "\r\n"
	rec = w.do(t, http.MethodPost, "/v1/realtime/sdp", ipFrankfurt, "application/sdp", ctl, nil)
	res, body = recorded(rec)
	if res.StatusCode/100 != 4 {
		t.Fatalf("offer with control characters: %d %s, want a 4xx", res.StatusCode, body)
	}
	var created float64
	for _, p := range w.pods {
		created += p.created(t)
	}
	if created != 1 {
		t.Errorf("pods created %v sessions, want only the first offer's", created)
	}
}

// wantPlaced checks that rec placed the call as want says and hangs it up,
// or, for a zero want, that it was refused 503 no_capacity with
// Retry-After.
func (w *world) wantPlaced(t *testing.T, rec *httptest.ResponseRecorder, want placement) {
	t.Helper()
	res, body := recorded(rec)
	if want == (placement{}) {
		wantAPIError(t, res, body, http.StatusServiceUnavailable, "no_capacity")
		if res.Header.Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		return
	}
	checkPlaced(t, res, body, want)
	w.hangup(t, rec, nil)
}
