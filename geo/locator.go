package geo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oschwald/geoip2-golang"

	"github.com/rtcedge/rtcedge/internal/config"
)

// Location sources reported in Location.Source.
const (
	// SourceCFHeaders: CF-IPLatitude / CF-IPLongitude from a trusted proxy.
	SourceCFHeaders = "cf-headers"
	// SourceGeoIP: a GeoIP City lookup of the client address.
	SourceGeoIP = "geoip"
	// SourceDefault: nothing located the client; LocatorConfig.Default.
	SourceDefault = "default"
)

// Header names read from trusted proxies.
const (
	headerCFConnectingIP = "CF-Connecting-IP"
	headerCFLatitude     = "CF-IPLatitude"
	headerCFLongitude    = "CF-IPLongitude"
	headerCFCountry      = "CF-IPCountry"
	headerCFCity         = "CF-IPCity"
	headerXFF            = "X-Forwarded-For"
)

// defaultReloadInterval is how often Run looks at DBPath when the config
// does not say; MaxMind publishes at most twice a week, so this is only about
// how soon a deployed file takes effect.
const defaultReloadInterval = 10 * time.Second

// LocatorConfig configures a Locator.
type LocatorConfig struct {
	// DBPath is a GeoIP2/GeoLite2 City .mmdb file; "" means none. Run reloads
	// it when it changes.
	DBPath string
	// DB is an in-memory database used instead of DBPath (the dev world embeds
	// DevGeoIPDB). Setting both is an error. The slice must not be modified
	// afterwards.
	DB []byte
	// ReloadInterval is how often Run checks DBPath for changes (default 10s).
	ReloadInterval time.Duration
	// CloudflareRanges are Cloudflare's edge addresses (CloudflareRanges()
	// returns the published list). CF-Connecting-IP, CF-IPLatitude,
	// CF-IPLongitude, CF-IPCountry and CF-IPCity are believed only when
	// the hop that reached signaling, or the first of its InternalProxies,
	// is in these ranges.
	CloudflareRanges []netip.Prefix
	// InternalProxies are the operator's own proxies in front of
	// signaling (ingress, load balancers). Each appends its peer to
	// X-Forwarded-For, which is walked right to left across them to find
	// the hop that reached the first of them. Their own CF-* headers are
	// never believed: anyone reaching an ingress directly could set them.
	InternalProxies []netip.Prefix
	// TrustedProxies is the former name of CloudflareRanges, still
	// accepted: its prefixes are treated as Cloudflare's.
	TrustedProxies []netip.Prefix
	// Default is used when nothing else locates the client; usually
	// Catalogue.DefaultLocation.
	Default Point
	// Logger receives reload events; nil discards them.
	Logger *slog.Logger
}

// Location is where a client is and how that was found out.
type Location struct {
	// IP is the client's address as seen through trusted proxies (the peer
	// address otherwise); invalid if RemoteAddr could not be parsed.
	IP    netip.Addr
	Point Point
	// Source is SourceCFHeaders, SourceGeoIP or SourceDefault.
	Source string
	// Country is an ISO 3166-1 alpha-2 code and City an English name, when
	// known.
	Country string
	City    string
}

// dbFile identifies the version of DBPath currently loaded, so Run can tell
// a replaced file from an unchanged one without reading it.
type dbFile struct {
	info os.FileInfo
}

func (f dbFile) same(info os.FileInfo) bool {
	return f.info != nil && os.SameFile(f.info, info) &&
		f.info.Size() == info.Size() && f.info.ModTime().Equal(info.ModTime())
}

// Locator finds a client's location from an HTTP request. Locate and
// LookupIP are safe for concurrent use, also while Run swaps the database.
type Locator struct {
	// Static after construction.
	cfg        LocatorConfig
	log        *slog.Logger
	ticker     time.Duration
	cloudflare []netip.Prefix // CloudflareRanges and TrustedProxies

	// db is the current reader, nil when there is none or after Close. The
	// reader is built from bytes read into memory, not a memory map, so a
	// swapped-out reader needs no Close and a lookup racing a swap is safe.
	db atomic.Pointer[geoip2.Reader]
	// closed is set by Close so that a reload racing it does not bring a
	// database back.
	closed atomic.Bool

	// loaded is owned by Run (and by NewLocator before Run starts).
	loaded dbFile
}

// NewLocator builds a Locator, opening the configured database if any. An
// unreadable or non-City database is an error here (at start-up), but only a
// logged warning when Run finds a bad replacement later.
func NewLocator(cfg LocatorConfig) (*Locator, error) {
	if cfg.DBPath != "" && cfg.DB != nil {
		return nil, fmt.Errorf("%w: both DBPath and DB are set", ErrInvalidLocatorConfig)
	}
	if cfg.ReloadInterval < 0 {
		return nil, fmt.Errorf("%w: negative ReloadInterval %v", ErrInvalidLocatorConfig, cfg.ReloadInterval)
	}
	if !cfg.Default.Valid() {
		return nil, fmt.Errorf("%w: default location %v out of range", ErrInvalidLocatorConfig, cfg.Default)
	}
	for _, p := range slices.Concat(cfg.CloudflareRanges, cfg.InternalProxies, cfg.TrustedProxies) {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: invalid proxy prefix", ErrInvalidLocatorConfig)
		}
	}
	l := &Locator{cfg: cfg, log: cfg.Logger, ticker: cfg.ReloadInterval,
		cloudflare: slices.Concat(cfg.CloudflareRanges, cfg.TrustedProxies)}
	config.Default(&l.log, slog.New(slog.DiscardHandler))
	l.log = l.log.With("component", "geo")
	config.Default(&l.ticker, defaultReloadInterval)
	switch {
	case cfg.DB != nil:
		r, err := openDB(cfg.DB)
		if err != nil {
			return nil, fmt.Errorf("new locator: %w", err)
		}
		l.db.Store(r)
	case cfg.DBPath != "":
		r, f, err := loadDBFile(cfg.DBPath)
		if err != nil {
			return nil, fmt.Errorf("new locator: %w", err)
		}
		l.db.Store(r)
		l.loaded = f
	}
	return l, nil
}

// openDB parses an in-memory database and insists on a City-capable type,
// so a Country or ASN file deployed by mistake is refused rather than
// answering every lookup with nothing.
func openDB(data []byte) (*geoip2.Reader, error) {
	r, err := geoip2.FromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidGeoIPDB, err)
	}
	if _, err := r.City(net.IPv4(1, 1, 1, 1)); err != nil {
		return nil, fmt.Errorf("%w: %s is not a City database: %w", ErrInvalidGeoIPDB, r.Metadata().DatabaseType, err)
	}
	return r, nil
}

// loadDBFile stats before reading: if the file changes in between, the next
// poll sees a different stat and loads it again, never the reverse.
func loadDBFile(path string) (*geoip2.Reader, dbFile, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, dbFile{}, fmt.Errorf("%w: %w", ErrInvalidGeoIPDB, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, dbFile{info}, fmt.Errorf("%w: %w", ErrInvalidGeoIPDB, err)
	}
	r, err := openDB(data)
	if err != nil {
		return nil, dbFile{info}, fmt.Errorf("%s: %w", path, err)
	}
	return r, dbFile{info}, nil
}

// Run polls DBPath's identity, size and modification time every
// ReloadInterval and, when they change, loads the new file and swaps it in
// atomically. A file that fails to load is logged and the old database kept;
// the same broken file is not retried until it changes again. Run returns nil
// when ctx is done. Without a DBPath it just waits for ctx. Call Run at most
// once.
func (l *Locator) Run(ctx context.Context) error {
	if l.cfg.DBPath == "" {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(l.ticker)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			l.poll()
		}
	}
}

// poll runs on Run's goroutine.
func (l *Locator) poll() {
	info, err := os.Stat(l.cfg.DBPath)
	if err != nil {
		// A missing file during a non-atomic deploy is transient; keep serving
		// the old data and say so once per change.
		if l.loaded.info != nil {
			l.log.Warn("geoip database unavailable, keeping the loaded one", "path", l.cfg.DBPath, "err", err)
			l.loaded = dbFile{}
		}
		return
	}
	if l.loaded.same(info) {
		return
	}
	r, f, err := loadDBFile(l.cfg.DBPath)
	l.loaded = f
	if err != nil {
		l.log.Warn("geoip database reload failed, keeping the loaded one", "path", l.cfg.DBPath, "err", err)
		return
	}
	l.db.Store(r)
	// Close stores nil after setting closed, so either its store lands after
	// ours or we see closed here.
	if l.closed.Load() {
		l.db.Store(nil)
		return
	}
	md := r.Metadata()
	l.log.Info("geoip database reloaded", "path", l.cfg.DBPath, "type", md.DatabaseType,
		"build", time.Unix(int64(md.BuildEpoch), 0).UTC())
}

// Close releases the database; later lookups fall back to the default
// location. Close is idempotent and always returns nil.
func (l *Locator) Close() error {
	l.closed.Store(true)
	l.db.Store(nil)
	return nil
}

// Locate returns the client's IP as seen through trusted proxies, its location
// and how it was found.
//
// The hop that reached signaling is r.RemoteAddr's IP. While that hop is
// one of InternalProxies, the hop before it is the right-most
// X-Forwarded-For entry not yet consumed (each internal proxy appends its
// peer). The first hop that is not an internal proxy is the origin as far
// as our own proxies can vouch; anything left of it may be forged. When
// that hop is Cloudflare (CloudflareRanges), its headers are believed:
// CF-IPLatitude/CF-IPLongitude (both valid and in range) give the location
// directly, and the client IP is CF-Connecting-IP if valid, else the
// X-Forwarded-For entry Cloudflare appended left of its own, else the
// Cloudflare hop. Any other origin hop is the client, and every CF-*
// header is ignored. A malformed X-Forwarded-For entry where a hop is
// needed means the chain cannot be trusted: the peer is used. The IP is
// then looked up in the GeoIP database; addresses that are loopback,
// private or not in it get the Default point.
func (l *Locator) Locate(r *http.Request) Location {
	peer := parseHostAddr(r.RemoteAddr)
	if !peer.IsValid() {
		return l.locateIP(peer)
	}
	hops := forwardedHops(r.Header.Values(headerXFF))
	hop, i := peer, len(hops)-1
	for in(l.cfg.InternalProxies, hop) && i >= 0 {
		a := parseHostAddr(hops[i])
		if !a.IsValid() {
			return l.locateIP(peer)
		}
		hop, i = a, i-1
	}
	if !in(l.cloudflare, hop) {
		return l.locateIP(hop)
	}
	ip := hop
	if a := parseHostAddr(r.Header.Get(headerCFConnectingIP)); a.IsValid() {
		ip = a
	} else if i >= 0 {
		if a := parseHostAddr(hops[i]); a.IsValid() {
			ip = a
		}
	}
	if p, ok := cfPoint(r.Header); ok {
		loc := Location{IP: ip, Point: p, Source: SourceCFHeaders, City: r.Header.Get(headerCFCity)}
		// Cloudflare uses XX for unknown and T1 for Tor; neither is a country.
		if c := r.Header.Get(headerCFCountry); len(c) == 2 && c != "XX" && c != "T1" {
			loc.Country = c
		}
		return loc
	}
	return l.locateIP(ip)
}

// locateIP looks ip up, falling back to the default point.
func (l *Locator) locateIP(ip netip.Addr) Location {
	if loc, ok := l.LookupIP(ip); ok {
		return loc
	}
	return Location{IP: ip, Point: l.cfg.Default, Source: SourceDefault}
}

// LookupIP looks ip up in the GeoIP database. It reports false for addresses
// that cannot be located: invalid, loopback, private, link-local, multicast or
// unspecified ones (never in a GeoIP database, so not worth a lookup), those
// absent from the database, records without coordinates, and any address when
// there is no database.
func (l *Locator) LookupIP(ip netip.Addr) (Location, bool) {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsUnspecified() ||
		ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsLinkLocalMulticast() {
		return Location{}, false
	}
	db := l.db.Load()
	if db == nil {
		return Location{}, false
	}
	rec, err := db.City(net.IP(ip.AsSlice()))
	if err != nil {
		return Location{}, false
	}
	// A miss decodes to a zero record. MaxMind never places a located record
	// at exactly 0,0, and a record without coordinates cannot rank regions,
	// so both count as "not found".
	p := Point{Lat: rec.Location.Latitude, Lon: rec.Location.Longitude}
	if p == (Point{}) || !p.Valid() {
		return Location{}, false
	}
	return Location{
		IP:      ip,
		Point:   p,
		Source:  SourceGeoIP,
		Country: rec.Country.IsoCode,
		City:    rec.City.Names["en"],
	}, true
}

// in reports whether ip is inside one of the prefixes.
func in(prefixes []netip.Prefix, ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// forwardedHops splits X-Forwarded-For header lines into their entries,
// left to right.
func forwardedHops(values []string) []string {
	var hops []string
	for _, v := range values {
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hops = append(hops, h)
			}
		}
	}
	return hops
}

// cfPoint reads CF-IPLatitude/CF-IPLongitude; both must be finite numbers in
// range, otherwise the pair is ignored as a whole.
func cfPoint(h http.Header) (Point, bool) {
	lat, err1 := strconv.ParseFloat(strings.TrimSpace(h.Get(headerCFLatitude)), 64)
	lon, err2 := strconv.ParseFloat(strings.TrimSpace(h.Get(headerCFLongitude)), 64)
	if err := errors.Join(err1, err2); err != nil {
		return Point{}, false
	}
	p := Point{Lat: lat, Lon: lon}
	if !p.Valid() {
		return Point{}, false
	}
	return p, true
}

// parseHostAddr accepts "ip", "ip:port" and "[ipv6]:port" and returns the
// unmapped address, or the invalid Addr.
func parseHostAddr(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		// A zone (fe80::1%eth0) says nothing about location; drop it so the
		// address compares equal to prefixes.
		return a.WithZone("").Unmap()
	}
	return netip.Addr{}
}
