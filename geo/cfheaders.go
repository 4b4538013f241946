package geo

import (
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/metric"
)

// Canonical header keys, read from the map directly: Header.Get would
// canonicalize (and allocate for) the spelled-out names on every request.
var (
	keyCFRay       = http.CanonicalHeaderKey("CF-Ray") // set on every request Cloudflare proxies
	keyCFLatitude  = http.CanonicalHeaderKey(headerCFLatitude)
	keyCFLongitude = http.CanonicalHeaderKey(headerCFLongitude)
)

func firstValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// DefaultCFHeaderThreshold is how many proxied requests without location
// headers CFHeaderCheck waits for before it warns.
const DefaultCFHeaderThreshold = 20

// CFHeaderCheckConfig configures a CFHeaderCheck.
type CFHeaderCheckConfig struct {
	// Proxies are the peers whose requests can come from Cloudflare:
	// Cloudflare's ranges and any ingress in front of signaling (the
	// Locator's trusted proxies).
	Proxies []netip.Prefix
	// Threshold is how many Cloudflare requests without CF-IPLatitude /
	// CF-IPLongitude, and none with, make it warn; default
	// DefaultCFHeaderThreshold.
	Threshold int
	// Logger gets the one warning; nil discards it.
	Logger *slog.Logger
	// Registerer, when set, gets rtcedge_signaling_cloudflare_requests_total.
	Registerer prometheus.Registerer
}

// CFHeaderCheck notices when Cloudflare proxies requests without the visitor
// location headers: they arrive only when the zone's "Add visitor location
// headers" managed transform is on, and without them every client is
// located by GeoIP (or lands in the default region). It counts requests
// that came through Cloudflare (a CF-Ray header from a trusted proxy) with
// and without a usable CF-IPLatitude/CF-IPLongitude pair, and logs one
// warning once Threshold of them have arrived and none carried the pair.
// Observe is safe for concurrent use and does not allocate.
type CFHeaderCheck struct {
	// Static after construction.
	proxies   []netip.Prefix
	threshold uint64
	log       *slog.Logger
	metric    *prometheus.CounterVec
	present   prometheus.Counter
	absent    prometheus.Counter

	with, without atomic.Uint64
	warned        atomic.Bool
}

// NewCFHeaderCheck returns a check; it registers its metric when
// cfg.Registerer is set.
func NewCFHeaderCheck(cfg CFHeaderCheckConfig) (*CFHeaderCheck, error) {
	c := &CFHeaderCheck{proxies: cfg.Proxies, threshold: uint64(cfg.Threshold), log: cfg.Logger}
	config.Default(&c.threshold, DefaultCFHeaderThreshold)
	config.Default(&c.log, slog.New(slog.DiscardHandler))
	c.metric = metric.CounterVec("rtcedge_signaling_cloudflare_requests_total", "Requests proxied by Cloudflare, by whether they carried the visitor location headers (CF-IPLatitude/CF-IPLongitude).", "location_headers")
	c.present, c.absent = c.metric.WithLabelValues("present"), c.metric.WithLabelValues("absent")
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(c.metric); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Observe counts r if Cloudflare proxied it.
func (c *CFHeaderCheck) Observe(r *http.Request) {
	if firstValue(r.Header, keyCFRay) == "" {
		return
	}
	peer := parseHostAddr(r.RemoteAddr)
	trusted := false
	for _, p := range c.proxies {
		trusted = trusted || p.Contains(peer)
	}
	if !trusted {
		return // a forged CF-Ray from anywhere else says nothing
	}
	if located(r.Header) {
		c.with.Add(1)
		c.present.Inc()
		return
	}
	n := c.without.Add(1)
	c.absent.Inc()
	if n >= c.threshold && c.with.Load() == 0 && c.warned.CompareAndSwap(false, true) {
		c.log.Warn("requests through Cloudflare carry no CF-IPLatitude/CF-IPLongitude: turn on the zone's "+
			"\"Add visitor location headers\" managed transform (rtcedge-cloudflare sync and the Terraform "+
			"steering module do; see docs/deploy.md); until then clients are located by GeoIP",
			"requests", n)
	}
}

// located reports whether h carries a usable CF-IPLatitude/CF-IPLongitude
// pair. Absent headers are checked first: a failed parse allocates its
// error.
func located(h http.Header) bool {
	latS, lonS := strings.TrimSpace(firstValue(h, keyCFLatitude)), strings.TrimSpace(firstValue(h, keyCFLongitude))
	if latS == "" || lonS == "" {
		return false
	}
	lat, err1 := strconv.ParseFloat(latS, 64)
	lon, err2 := strconv.ParseFloat(lonS, 64)
	return err1 == nil && err2 == nil && Point{Lat: lat, Lon: lon}.Valid()
}

// Wrap returns next with every request observed first.
func (c *CFHeaderCheck) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.Observe(r)
		next.ServeHTTP(w, r)
	})
}

// Missing reports whether Threshold requests came through Cloudflare and
// none carried the location headers: the managed transform is off.
func (c *CFHeaderCheck) Missing() bool {
	return c.with.Load() == 0 && c.without.Load() >= c.threshold
}
