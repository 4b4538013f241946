package geo

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/mmdbfixture"
)

var (
	frankfurt = Point{50.11, 8.68}
	ashburn   = Point{39.04, -77.49}
	singapore = Point{1.35, 103.82}
	nowhere   = Point{-33.87, 151.21} // the configured default in these tests
)

func newDevLocator(t *testing.T, trusted ...string) *Locator {
	t.Helper()
	cfg := LocatorConfig{DB: DevGeoIPDB, Default: nowhere}
	for _, p := range trusted {
		cfg.TrustedProxies = append(cfg.TrustedProxies, netip.MustParsePrefix(p))
	}
	l, err := NewLocator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestLookupIP(t *testing.T) {
	l := newDevLocator(t)
	tests := []struct {
		ip      string
		ok      bool
		point   Point
		country string
		city    string
	}{
		{"192.0.2.1", true, frankfurt, "DE", "Frankfurt am Main"},
		{"198.51.100.255", true, ashburn, "US", "Ashburn"},
		{"203.0.113.0", true, singapore, "SG", "Singapore"},
		{"::ffff:203.0.113.9", true, singapore, "SG", "Singapore"},
		{"2001:db8:1:2::3", true, frankfurt, "DE", "Frankfurt am Main"},
		{"2001:db8:2::", true, ashburn, "US", "Ashburn"},
		{"2001:db8:3::42", true, singapore, "SG", "Singapore"},
		{"2001:db8:4::1", false, Point{}, "", ""},
		{"192.0.3.1", false, Point{}, "", ""},
		{"127.0.0.1", false, Point{}, "", ""},
		{"::1", false, Point{}, "", ""},
		{"10.0.0.1", false, Point{}, "", ""},
		{"192.168.1.1", false, Point{}, "", ""},
		{"fd00::1", false, Point{}, "", ""},
		{"169.254.1.1", false, Point{}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.ip, func(t *testing.T) {
			loc, ok := l.LookupIP(netip.MustParseAddr(tt.ip))
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v (%+v)", ok, tt.ok, loc)
			}
			if !ok {
				return
			}
			if loc.Point != tt.point || loc.Country != tt.country || loc.City != tt.city || loc.Source != SourceGeoIP {
				t.Errorf("got %+v", loc)
			}
			if loc.IP != netip.MustParseAddr(tt.ip).Unmap() {
				t.Errorf("IP = %v", loc.IP)
			}
		})
	}
	if _, ok := l.LookupIP(netip.Addr{}); ok {
		t.Error("invalid address located")
	}
}

// TestFixtureHoldsNoPrivateRanges reads the embedded database directly,
// bypassing LookupIP's short-cut, so the fixture itself is checked.
func TestFixtureHoldsNoPrivateRanges(t *testing.T) {
	r, err := openDB(DevGeoIPDB)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.0.1", "::1", "fd00::1"} {
		rec, err := r.City(net.IP(netip.MustParseAddr(ip).AsSlice()))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Location.Latitude != 0 || rec.Location.Longitude != 0 || rec.Country.IsoCode != "" {
			t.Errorf("%s is in the fixture: %+v", ip, rec)
		}
	}
}

// TestFixtureIsCurrent fails when the checked-in .mmdb differs from what the
// generator writes, i.e. someone changed the records without `go generate`.
func TestFixtureIsCurrent(t *testing.T) {
	want, err := mmdbfixture.Build(mmdbfixture.Default)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(DevGeoIPDB, want) {
		t.Error("testdata/GeoIP2-City-Test.mmdb is stale; run go generate ./geo")
	}
}

// Addresses for the proxy trust tests: a Cloudflare edge (inside the
// published ranges) and an operator's ingress (InternalProxies).
const (
	cfEdge   = "172.64.1.1"
	cfEdgeV6 = "2606:4700::1"
	ingress  = "10.1.1.1"
)

func newProxyLocator(t *testing.T) *Locator {
	t.Helper()
	internal, err := ParsePrefixes([]string{"10.0.0.0/8", "2001:db8:ffff::/48"})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := ParsePrefixes([]string{CloudflareKeyword})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLocator(LocatorConfig{DB: DevGeoIPDB, Default: nowhere, CloudflareRanges: cf, InternalProxies: internal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type locateCase struct {
	name       string
	remote     string
	headers    map[string][]string
	wantIP     string
	wantPoint  Point
	wantSource string
	country    string
}

func runLocate(t *testing.T, l *Locator, tests []locateCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/realtime/sdp", nil)
			r.RemoteAddr = tt.remote
			for k, vs := range tt.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got := l.Locate(r)
			if got.IP.String() != tt.wantIP || got.Point != tt.wantPoint || got.Source != tt.wantSource || got.Country != tt.country {
				t.Errorf("Locate = %+v\nwant IP %s point %v source %s country %q", got, tt.wantIP, tt.wantPoint, tt.wantSource, tt.country)
			}
		})
	}
}

// spoofed are the CF-* headers an attacker would send to pick Singapore.
var spoofed = map[string][]string{
	"CF-Connecting-IP": {"203.0.113.1"}, "CF-IPLatitude": {"1.35"}, "CF-IPLongitude": {"103.82"}, "CF-IPCountry": {"SG"},
}

func with(h map[string][]string, k string, v ...string) map[string][]string {
	out := map[string][]string{k: v}
	for hk, hv := range h {
		out[hk] = hv
	}
	return out
}

func TestLocate(t *testing.T) {
	runLocate(t, newProxyLocator(t), []locateCase{
		{
			name: "untrusted peer, no headers", remote: "192.0.2.7:5000",
			wantIP: "192.0.2.7", wantPoint: frankfurt, wantSource: SourceGeoIP, country: "DE",
		},
		{
			name: "untrusted peer, all headers ignored", remote: "198.51.100.1:5000",
			headers: with(spoofed, "X-Forwarded-For", "192.0.2.1"),
			wantIP:  "198.51.100.1", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
		{
			name: "untrusted private peer gets default", remote: "192.168.1.1:5000",
			headers: map[string][]string{"CF-Connecting-IP": {"203.0.113.1"}},
			wantIP:  "192.168.1.1", wantPoint: nowhere, wantSource: SourceDefault,
		},
		{
			name: "Cloudflare peer: CF lat/lon win", remote: cfEdge + ":443",
			headers: map[string][]string{
				"CF-Connecting-IP": {"192.0.2.1"},
				"CF-IPLatitude":    {"48.85"}, "CF-IPLongitude": {"2.35"}, "CF-IPCountry": {"FR"},
			},
			wantIP: "192.0.2.1", wantPoint: Point{48.85, 2.35}, wantSource: SourceCFHeaders, country: "FR",
		},
		{
			name: "Cloudflare peer: CF lat/lon with unknown country", remote: cfEdge + ":443",
			headers: map[string][]string{"CF-IPLatitude": {"48.85"}, "CF-IPLongitude": {"2.35"}, "CF-IPCountry": {"XX"}},
			wantIP:  cfEdge, wantPoint: Point{48.85, 2.35}, wantSource: SourceCFHeaders,
		},
		{
			name: "Cloudflare peer: CF-Connecting-IP", remote: cfEdge + ":443",
			headers: map[string][]string{"CF-Connecting-IP": {"203.0.113.5"}, "X-Forwarded-For": {"192.0.2.1"}},
			wantIP:  "203.0.113.5", wantPoint: singapore, wantSource: SourceGeoIP, country: "SG",
		},
		{
			name: "Cloudflare IPv6 peer: CF-Connecting-IP v6", remote: "[" + cfEdgeV6 + "]:443",
			headers: map[string][]string{"CF-Connecting-IP": {"2001:db8:2::9"}},
			wantIP:  "2001:db8:2::9", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
		{
			name: "malformed latitude ignored", remote: cfEdge + ":443",
			headers: map[string][]string{"CF-Connecting-IP": {"192.0.2.1"}, "CF-IPLatitude": {"north"}, "CF-IPLongitude": {"2.35"}},
			wantIP:  "192.0.2.1", wantPoint: frankfurt, wantSource: SourceGeoIP, country: "DE",
		},
		{
			name: "latitude out of range ignored", remote: cfEdge + ":443",
			headers: map[string][]string{"CF-Connecting-IP": {"192.0.2.1"}, "CF-IPLatitude": {"95"}, "CF-IPLongitude": {"2.35"}},
			wantIP:  "192.0.2.1", wantPoint: frankfurt, wantSource: SourceGeoIP, country: "DE",
		},
		{
			name: "NaN longitude ignored", remote: cfEdge + ":443",
			headers: map[string][]string{"CF-Connecting-IP": {"192.0.2.1"}, "CF-IPLatitude": {"1"}, "CF-IPLongitude": {"NaN"}},
			wantIP:  "192.0.2.1", wantPoint: frankfurt, wantSource: SourceGeoIP, country: "DE",
		},
		{
			name: "only latitude ignored", remote: cfEdge + ":443",
			headers: map[string][]string{"CF-Connecting-IP": {"192.0.2.1"}, "CF-IPLatitude": {"1"}},
			wantIP:  "192.0.2.1", wantPoint: frankfurt, wantSource: SourceGeoIP, country: "DE",
		},
		{
			name: "malformed CF-Connecting-IP: the entry Cloudflare appended", remote: cfEdge + ":443",
			headers: map[string][]string{"CF-Connecting-IP": {"bogus"}, "X-Forwarded-For": {"192.0.2.66, 198.51.100.4"}},
			wantIP:  "198.51.100.4", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
		{
			name: "Cloudflare through the ingress: CF headers believed", remote: ingress + ":443",
			headers: with(spoofed, "X-Forwarded-For", "203.0.113.1, "+cfEdge),
			wantIP:  "203.0.113.1", wantPoint: singapore, wantSource: SourceCFHeaders, country: "SG",
		},
		{
			name: "Cloudflare through two internal proxies", remote: ingress + ":443",
			headers: map[string][]string{"CF-Connecting-IP": {"203.0.113.5"}, "X-Forwarded-For": {"192.0.2.1, " + cfEdge + ", 10.2.2.2"}},
			wantIP:  "203.0.113.5", wantPoint: singapore, wantSource: SourceGeoIP, country: "SG",
		},
		{
			name: "Cloudflare through an IPv6 ingress", remote: "[2001:db8:ffff::1]:443",
			headers: map[string][]string{"CF-Connecting-IP": {"2001:db8:2::9"}, "X-Forwarded-For": {cfEdgeV6}},
			wantIP:  "2001:db8:2::9", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
		// The reproduction: anyone reaching the ingress directly
		// must not pick their own location or rate-limit key.
		{
			name: "attacker at the ingress: CF headers ignored", remote: ingress + ":443",
			headers: with(spoofed, "X-Forwarded-For", "198.51.100.1"),
			wantIP:  "198.51.100.1", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
		{
			name: "attacker at the ingress forging a Cloudflare hop", remote: ingress + ":443",
			headers: with(spoofed, "X-Forwarded-For", "203.0.113.1, "+cfEdge+", 198.51.100.1"),
			wantIP:  "198.51.100.1", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
		{
			name: "ingress peer without X-Forwarded-For: CF headers ignored", remote: ingress + ":443",
			headers: spoofed,
			wantIP:  ingress, wantPoint: nowhere, wantSource: SourceDefault,
		},
		{
			name: "XFF right-most untrusted wins over spoofed left", remote: ingress + ":443",
			headers: map[string][]string{"X-Forwarded-For": {"192.0.2.66, 203.0.113.8, 10.2.2.2"}},
			wantIP:  "203.0.113.8", wantPoint: singapore, wantSource: SourceGeoIP, country: "SG",
		},
		{
			name: "XFF across several header lines", remote: ingress + ":443",
			headers: map[string][]string{"X-Forwarded-For": {"192.0.2.66", "198.51.100.9, 10.3.3.3", "10.2.2.2"}},
			wantIP:  "198.51.100.9", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
		{
			name: "XFF entries with ports", remote: ingress + ":443",
			headers: map[string][]string{"X-Forwarded-For": {"[2001:db8:3::1]:1234, 10.2.2.2:80"}},
			wantIP:  "2001:db8:3::1", wantPoint: singapore, wantSource: SourceGeoIP, country: "SG",
		},
		{
			name: "XFF malformed right-most untrusted entry: use peer", remote: ingress + ":443",
			headers: map[string][]string{"X-Forwarded-For": {"192.0.2.1, garbage"}},
			wantIP:  ingress, wantPoint: nowhere, wantSource: SourceDefault,
		},
		{
			name: "XFF all internal: left-most", remote: ingress + ":443",
			headers: map[string][]string{"X-Forwarded-For": {"10.9.9.9, 10.2.2.2"}},
			wantIP:  "10.9.9.9", wantPoint: nowhere, wantSource: SourceDefault,
		},
		{
			name: "unparseable RemoteAddr", remote: "pipe",
			headers: map[string][]string{"CF-Connecting-IP": {"192.0.2.1"}},
			wantIP:  "invalid IP", wantPoint: nowhere, wantSource: SourceDefault,
		},
	})
}

// TestLocateLegacyTrustedProxies: the former trusted_proxies list keeps
// working as Cloudflare's ranges (the dev world and tests stand in for
// Cloudflare on loopback with it).
func TestLocateLegacyTrustedProxies(t *testing.T) {
	runLocate(t, newDevLocator(t, "127.0.0.0/8"), []locateCase{
		{
			name: "trusted peer: CF headers", remote: "127.0.0.1:443", headers: spoofed,
			wantIP: "203.0.113.1", wantPoint: singapore, wantSource: SourceCFHeaders, country: "SG",
		},
		{
			name: "trusted peer: XFF", remote: "127.0.0.1:443", headers: map[string][]string{"X-Forwarded-For": {"198.51.100.9"}},
			wantIP: "198.51.100.9", wantPoint: ashburn, wantSource: SourceGeoIP, country: "US",
		},
	})
}

// TestCloudflareRanges: the shipped list is Cloudflare's published one.
func TestCloudflareRanges(t *testing.T) {
	got := CloudflareRanges()
	v4, v6 := 0, 0
	for _, p := range got {
		if p.Addr().Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 != 15 || v6 != 7 {
		t.Fatalf("%d IPv4 and %d IPv6 ranges, want 15 and 7", v4, v6)
	}
	for _, a := range []string{"173.245.48.1", "104.16.0.1", "131.0.75.254", "2a06:98c7::1", "2c0f:f248::1"} {
		if !in(got, netip.MustParseAddr(a)) {
			t.Errorf("%s is a Cloudflare address", a)
		}
	}
	for _, a := range []string{"1.1.1.1", "10.0.0.1", "2606:4701::1"} {
		if in(got, netip.MustParseAddr(a)) {
			t.Errorf("%s is not in Cloudflare's edge ranges", a)
		}
	}
	if _, err := ParsePrefixes([]string{"cloudflare", "10.0.0.0/8", "nonsense"}); err == nil {
		t.Error("ParsePrefixes accepted nonsense")
	}
}

func TestNewLocatorErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.mmdb")
	if err := os.WriteFile(garbage, []byte("not a database"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  LocatorConfig
		want error
	}{
		{"both DB and DBPath", LocatorConfig{DB: DevGeoIPDB, DBPath: garbage}, ErrInvalidLocatorConfig},
		{"negative interval", LocatorConfig{ReloadInterval: -time.Second}, ErrInvalidLocatorConfig},
		{"default out of range", LocatorConfig{Default: Point{100, 0}}, ErrInvalidLocatorConfig},
		{"invalid proxy prefix", LocatorConfig{TrustedProxies: []netip.Prefix{{}}}, ErrInvalidLocatorConfig},
		{"garbage bytes", LocatorConfig{DB: []byte("nope")}, ErrInvalidGeoIPDB},
		{"garbage file", LocatorConfig{DBPath: garbage}, ErrInvalidGeoIPDB},
		{"missing file", LocatorConfig{DBPath: filepath.Join(dir, "missing.mmdb")}, ErrInvalidGeoIPDB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := NewLocator(tt.cfg)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if l != nil {
				t.Error("locator returned with error")
			}
		})
	}
}

func TestNoDatabase(t *testing.T) {
	l, err := NewLocator(LocatorConfig{Default: nowhere})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	if got := l.Locate(r); got.Source != SourceDefault || got.Point != nowhere {
		t.Errorf("Locate = %+v", got)
	}
	// Without a file Run only waits for its context.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	if err := l.Close(); err != nil {
		t.Error(err)
	}
}

func TestCloseFallsBackToDefault(t *testing.T) {
	l := newDevLocator(t)
	if _, ok := l.LookupIP(netip.MustParseAddr("192.0.2.1")); !ok {
		t.Fatal("fixture address not found")
	}
	for range 2 { // idempotent
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := l.LookupIP(netip.MustParseAddr("192.0.2.1")); ok {
		t.Error("lookup after Close succeeded")
	}
}

// logSink is a slog handler that hands every record to a channel, so a test
// can await a log event instead of sleeping.
type logSink chan slog.Record

func (s logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s logSink) Handle(_ context.Context, r slog.Record) error {
	// Never block the Run goroutine: a stuck logger would keep it from
	// seeing its context end.
	select {
	case s <- r:
	default:
	}
	return nil
}
func (s logSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s logSink) WithGroup(string) slog.Handler      { return s }

func TestReload(t *testing.T) {
	build := func(city string, p Point) []byte {
		t.Helper()
		db, err := mmdbfixture.Build([]mmdbfixture.Record{{
			Network: netip.MustParsePrefix("192.0.2.0/24"), City: city, Country: "XY", Lat: p.Lat, Lon: p.Lon,
		}})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "city.mmdb")
	// replace writes next to the target and renames, as a deploy would, so
	// the Locator never reads a half-written file.
	replace := func(data []byte) {
		t.Helper()
		tmp := filepath.Join(dir, "city.mmdb.tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	replace(build("First", frankfurt))

	logs := make(logSink, 16)
	l, err := NewLocator(LocatorConfig{
		DBPath: path, ReloadInterval: time.Millisecond, Default: nowhere, Logger: slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ip := netip.MustParseAddr("192.0.2.1")
	if loc, _ := l.LookupIP(ip); loc.City != "First" {
		t.Fatalf("initial city %q", loc.City)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	awaitLog := func(level slog.Level) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case r := <-logs:
				if r.Level == level {
					return
				}
			case <-deadline:
				t.Fatalf("no %v log within the deadline", level)
			}
		}
	}

	// A good new file is picked up.
	replace(build("Second", singapore))
	awaitLog(slog.LevelInfo)
	if loc, ok := l.LookupIP(ip); !ok || loc.City != "Second" || loc.Point != singapore {
		t.Fatalf("after reload: %+v, %v", loc, ok)
	}

	// A broken file is logged and the loaded database kept.
	replace([]byte("truncated download"))
	awaitLog(slog.LevelWarn)
	if loc, ok := l.LookupIP(ip); !ok || loc.City != "Second" {
		t.Fatalf("after bad reload: %+v, %v", loc, ok)
	}

	// And a good file after the broken one is loaded again.
	replace(build("Third", ashburn))
	awaitLog(slog.LevelInfo)
	if loc, ok := l.LookupIP(ip); !ok || loc.City != "Third" {
		t.Fatalf("after recovery: %+v, %v", loc, ok)
	}
}
