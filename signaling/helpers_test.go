package signaling_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/echo"
	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/testlog"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/signaling"
	"github.com/rtcedge/rtcedge/transceiver"
)

// Fixture client addresses: geo.DevGeoIPDB places them in the three test
// regions (see geo/testdata/README.md).
const (
	ipFrankfurt = "192.0.2.10"
	ipAshburn   = "198.51.100.7"
	ipSingapore = "203.0.113.9"
)

// testRegions mirror the GeoIP fixture: one cluster and one POP each. The
// POP VIPs need not exist; pods only advertise them.
var testRegions = []struct {
	name    string
	loc     geo.Point
	cluster uint16
	pop     uint16
	popName string
	vip     netip.AddrPort
}{
	{"eu-central", geo.Point{Lat: 50.11, Lon: 8.68}, 1, 1, "fra", netip.MustParseAddrPort("127.0.0.2:3478")},
	{"us-east", geo.Point{Lat: 39.04, Lon: -77.49}, 2, 2, "iad", netip.MustParseAddrPort("127.0.0.3:3478")},
	{"ap-southeast", geo.Point{Lat: 1.35, Lon: 103.82}, 3, 3, "sin", netip.MustParseAddrPort("127.0.0.4:3478")},
}

func testLogger() *slog.Logger { return testlog.Logger() }

// pod is a real transceiver pod with its session API on loopback.
type pod struct {
	tr  *transceiver.Transceiver
	url string
	reg *prometheus.Registry
}

// recorder is the echo backend that remembers the session config of every
// session it opens.
type recorder struct {
	echo.Backend
	mu      sync.Mutex
	configs []string
	infos   []backend.SessionInfo
}

func (r *recorder) Open(ctx context.Context, info backend.SessionInfo, out backend.Sink) (backend.Handler, error) {
	r.mu.Lock()
	r.configs = append(r.configs, string(info.Config))
	r.infos = append(r.infos, info)
	r.mu.Unlock()
	return r.Backend.Open(ctx, info, out)
}

// lastInfo returns what the backend was told of the last session opened.
func (r *recorder) lastInfo() backend.SessionInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.infos) == 0 {
		return backend.SessionInfo{}
	}
	return r.infos[len(r.infos)-1]
}

// last returns the config of the last session opened.
func (r *recorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.configs) == 0 {
		return "<none>"
	}
	return r.configs[len(r.configs)-1]
}

func startPod(t *testing.T, cluster uint16, be backend.Backend, apiSecret string) *pod {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, token.KeyLen)
	_, _ = rand.Read(key)
	keys, err := token.NewKeyring(1, map[uint8][]byte{1: key})
	if err != nil {
		t.Fatal(err)
	}
	hop, err := encap.NewKeyring(1, map[uint8][]byte{1: key[:encap.KeyLen]})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	tr, err := transceiver.New(transceiver.Config{
		Cluster: cluster, Pod: 1, Keys: keys, Hop: hop, Backend: be, SessionAPISecret: apiSecret,
		Logger: testLogger(), Registerer: reg,
	}, conn)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	srv := httptest.NewServer(tr.Handler())
	t.Cleanup(func() {
		srv.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pod of cluster %d: %v", cluster, err)
		}
	})
	return &pod{tr: tr, url: srv.URL, reg: reg}
}

// created returns how many sessions the pod has ever created.
func (p *pod) created(t *testing.T) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "rtcedge_transceiver_sessions_created_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// world is real signaling in front of the three test regions. api maps a
// cluster ID to its session API; clusters missing from it get a real pod.
type world struct {
	srv  *signaling.Server
	h    http.Handler
	cat  *geo.Catalogue
	pods map[uint16]*pod
	reg  *prometheus.Registry
	// backend is every real pod's backend.
	backend *recorder
}

type worldConfig struct {
	api     map[uint16]string
	proxies []netip.Prefix // Cloudflare's ranges (LocatorConfig.TrustedProxies)
	// internal are the operator's ingress addresses
	// (LocatorConfig.InternalProxies).
	internal []netip.Prefix
	tweak    func(*signaling.Config)
	// apiSecret, when set, is every pod's session API secret (and what
	// signaling is configured with, unless tweak changes it).
	apiSecret string
}

func newWorld(t *testing.T, wc worldConfig) *world {
	t.Helper()
	w := &world{cat: &geo.Catalogue{DefaultRegion: testRegions[0].name}, pods: map[uint16]*pod{}, reg: prometheus.NewRegistry(), backend: &recorder{}}
	secrets := map[uint16]string{}
	for _, r := range testRegions {
		url, ok := wc.api[r.cluster]
		if !ok {
			p := startPod(t, r.cluster, w.backend, wc.apiSecret)
			w.pods[r.cluster] = p
			url = p.url
		}
		if wc.apiSecret != "" {
			secrets[r.cluster] = wc.apiSecret
		}
		w.cat.Regions = append(w.cat.Regions, geo.Region{
			Name: r.name, Location: r.loc,
			Clusters: []geo.Cluster{{ID: r.cluster, Name: r.name + "-1", Location: r.loc, SessionAPI: url}},
			POPs:     []geo.POP{{ID: r.pop, Name: r.popName, VIP: r.vip, Location: r.loc}},
		})
	}
	if err := w.cat.Validate(); err != nil {
		t.Fatal(err)
	}
	loc, err := geo.NewLocator(geo.LocatorConfig{DB: geo.DevGeoIPDB, Default: w.cat.DefaultLocation(), TrustedProxies: wc.proxies,
		InternalProxies: wc.internal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loc.Close() })
	// Our own client, so that its idle connections can be closed before
	// the leak check.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	t.Cleanup(client.CloseIdleConnections)
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	cfg := signaling.Config{
		CatalogueData: w.cat, Locator: loc, ClientSecretKey: base64.StdEncoding.EncodeToString(secret), AllowAnonymous: true, SessionAPISecrets: secrets,
		RatePerSecond: 1000, RateBurst: 1000, SecretRatePerSecond: 1000, SecretRateBurst: 1000,
		HTTPClient: client, Logger: testLogger(), Registerer: w.reg,
	}
	if wc.tweak != nil {
		wc.tweak(&cfg)
	}
	if w.srv, err = signaling.New(cfg); err != nil {
		t.Fatal(err)
	}
	w.h = w.srv.Handler()
	return w
}

// serve runs the handler behind a real http.Server on loopback and
// returns its base URL.
func serve(t *testing.T, h http.Handler, opts ...signaling.HTTPOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := signaling.NewHTTPServer(h, testLogger(), opts...)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// do sends a request straight to the handler as if from peer.
func (w *world) do(t *testing.T, method, path, peer, contentType, body string, hdr http.Header) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = netip.AddrPortFrom(netip.MustParseAddr(peer), 40000).String()
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		r.Header[k] = v
	}
	rec := httptest.NewRecorder()
	w.h.ServeHTTP(rec, r)
	return rec
}

// hangup deletes the session a 201 named, so the pod frees it.
func (w *world) hangup(t *testing.T, rec *httptest.ResponseRecorder, hdr http.Header) {
	t.Helper()
	loc := rec.Header().Get("Location")
	if loc == "" {
		return
	}
	if res := w.do(t, http.MethodDelete, loc, "127.0.0.1", "", "", hdr); res.Code != http.StatusNoContent {
		t.Errorf("DELETE %s = %d %s", loc, res.Code, res.Body)
	}
}

// wantAPIError checks a JSON error response.
func wantAPIError(t *testing.T, res *http.Response, body []byte, status int, code string) {
	t.Helper()
	if res.StatusCode != status {
		t.Errorf("status %d, want %d (body %s)", res.StatusCode, status, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var e apierr.Body
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	if e.Error.Type == "" || e.Error.Message == "" || e.Error.Code == "" {
		t.Errorf("incomplete error body %s", body)
	}
	if code != "" && e.Error.Code != code {
		t.Errorf("error code %q, want %q (%s)", e.Error.Code, code, e.Error.Message)
	}
}

func recorded(rec *httptest.ResponseRecorder) (*http.Response, []byte) {
	res := rec.Result()
	body, _ := io.ReadAll(res.Body)
	return res, body
}
