// Package cloudflare keeps Cloudflare's load balancer for the signaling
// hostname in step with the region catalogue: one health monitor, one pool
// per region whose origins are the region's signaling endpoints, and a geo-
// or proximity-steered load balancer. Sync is one-shot and idempotent: it
// creates what is missing, updates what drifted, writes nothing when all
// matches, and only ever modifies or deletes objects carrying its ownership
// tag (a description prefix), so hand-made or Terraform-made objects are
// left alone. It talks to the API through cloudflare-go/v6.
package cloudflare

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/rtcedge/rtcedge/geo"
)

// ErrInvalidConfig wraps every problem found in a sync config.
var ErrInvalidConfig = errors.New("invalid cloudflare sync config")

// Steering policies the load balancer may use.
const (
	SteeringGeo       = "geo"       // region_pools / country_pools from the config
	SteeringProximity = "proximity" // nearest pool by pool latitude/longitude
)

// Config is the sync config file (YAML, decoded strictly). The API token is
// not in it: it comes from $CLOUDFLARE_API_TOKEN.
type Config struct {
	AccountID string `yaml:"account_id"` // owns monitors and pools
	ZoneID    string `yaml:"zone_id"`    // holds the load balancer
	Hostname  string `yaml:"hostname"`   // signaling hostname, e.g. rt.example.com
	// NamePrefix names pools <prefix>-<region> and scopes the ownership tag,
	// so two deployments (say prod and staging) in one account never touch
	// each other's objects. Default "rtcedge".
	NamePrefix string `yaml:"name_prefix"`
	// SteeringPolicy is "geo" (default) or "proximity".
	SteeringPolicy string `yaml:"steering_policy"`
	// FallbackRegion takes the traffic when every pool is unhealthy; default
	// the catalogue's default_region.
	FallbackRegion string `yaml:"fallback_region"`
	// RegionOrder is the failover order (default_pools); regions not listed
	// follow by name.
	RegionOrder []string `yaml:"region_order"`
	// Proxied puts the hostname behind Cloudflare's proxy (default true), so
	// signaling gets CF-IPLatitude/CF-IPLongitude.
	Proxied *bool `yaml:"proxied"`
	// TTL of the DNS answer when not proxied, seconds (default 30).
	TTL     int64         `yaml:"ttl"`
	Monitor MonitorConfig `yaml:"monitor"`
	// CheckRegions are the Cloudflare regions the monitor probes the pools
	// from. Default: every region code the config's regions claim. The API
	// reads null as "every Cloudflare data centre", which only Enterprise
	// plans may use (and which floods the origins with probes), so sync
	// always sends a list.
	CheckRegions []string `yaml:"check_regions"`
	// VisitorLocationHeaders turns on the zone's "Add visitor location
	// headers" managed transform (default true): without it Cloudflare sends
	// no CF-IPLatitude/CF-IPLongitude and signaling falls back to GeoIP.
	VisitorLocationHeaders *bool `yaml:"visitor_location_headers"`
	// Regions by catalogue region name. Every catalogue region with a
	// cluster needs an entry; regions with only POPs run no signaling.
	Regions map[string]RegionConfig `yaml:"regions"`
}

// MonitorConfig is the HTTPS health check of the signaling origins.
type MonitorConfig struct {
	Path          string `yaml:"path"`           // default /readyz
	ExpectedCodes string `yaml:"expected_codes"` // default 200
	Port          int64  `yaml:"port"`           // 0 = 443
	Interval      int64  `yaml:"interval"`       // seconds, default 60
	Timeout       int64  `yaml:"timeout"`        // seconds, default 5
	Retries       int64  `yaml:"retries"`        // default 2
}

// RegionConfig maps one catalogue region onto Cloudflare.
type RegionConfig struct {
	// Origins are the addresses (IPs or hostnames) of the region's public
	// signaling endpoints.
	Origins []string `yaml:"origins"`
	// CloudflareRegions are Cloudflare region codes (RegionCodes: WNAM,
	// ENAM, WEU, EEU, NSAM, SSAM, OC, ME, NAF, SAF, SAS, SEAS, NEAS) that geo
	// steering sends to this region first.
	CloudflareRegions []string `yaml:"cloudflare_regions"`
	// Countries are ISO 3166-1 alpha-2 codes geo steering sends here first.
	Countries []string `yaml:"countries"`
}

// LoadConfig reads and decodes the config file at path strictly (unknown
// keys are errors) and applies defaults; Desired validates it against a
// catalogue.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load cloudflare sync config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes a YAML config strictly and applies defaults.
func ParseConfig(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document", ErrInvalidConfig)
		}
		return nil, fmt.Errorf("%w: decode: %w", ErrInvalidConfig, err)
	}
	c.defaults()
	return &c, nil
}

func (c *Config) defaults() {
	c.NamePrefix = cmp.Or(c.NamePrefix, "rtcedge")
	c.SteeringPolicy = cmp.Or(c.SteeringPolicy, SteeringGeo)
	c.TTL = cmp.Or(c.TTL, 30)
	c.Proxied = cmp.Or(c.Proxied, new(true))
	c.VisitorLocationHeaders = cmp.Or(c.VisitorLocationHeaders, new(true))
	m := &c.Monitor
	m.Path = cmp.Or(m.Path, "/readyz")
	m.ExpectedCodes = cmp.Or(m.ExpectedCodes, "200")
	m.Interval = cmp.Or(m.Interval, 60)
	m.Timeout = cmp.Or(m.Timeout, 5)
	m.Retries = cmp.Or(m.Retries, 2)
}

// ownerTag marks descriptions of the objects this prefix's sync owns.
func (c *Config) ownerTag() string { return "rtcedge-sync:" + c.NamePrefix }

// owns reports whether an object with this description was made by us.
func (c *Config) owns(description string) bool {
	return strings.HasPrefix(description, c.ownerTag()+" ")
}

func (c *Config) describe(what string) string { return c.ownerTag() + " " + what }

// The desired state, in plain values; sync turns it into API parameters.
type (
	desiredState struct {
		Monitor monitorSpec
		Pools   []poolSpec // sorted by region
		LB      lbSpec
	}
	monitorSpec struct {
		Description, Path, ExpectedCodes, Host string
		Port, Interval, Timeout, Retries       int64
	}
	poolSpec struct {
		Region, Name, Description string
		Latitude, Longitude       float64
		Origins                   []originSpec // sorted by name
		CheckRegions              []string     // sorted
	}
	originSpec struct{ Name, Address string }
	lbSpec     struct {
		Name, Description string
		Proxied           bool
		TTL               int64
		Steering          string
		DefaultRegions    []string            // failover order
		FallbackRegion    string              //
		RegionPools       map[string][]string // Cloudflare region -> regions, in order
		CountryPools      map[string][]string // country -> regions, in order
		// VisitorLocationHeaders: enable the zone's managed transform.
		VisitorLocationHeaders bool
	}
)

var poolNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// problems collects what is wrong with a config, to report it all at once.
type problems []error

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...)))
}

// desired validates c against the catalogue and computes what Cloudflare
// should hold. Every problem is reported at once.
func (c *Config) desired(cat *geo.Catalogue) (*desiredState, error) {
	var bad problems
	c.checkRequired(&bad)
	names := c.signalingRegions(cat, &bad)
	checkRegions := c.checkRegions(&bad)
	d := &desiredState{Monitor: c.monitor(), Pools: c.pools(cat, names, checkRegions, &bad)}
	order := c.failoverOrder(names, &bad)
	d.LB = c.loadBalancer(cat, names, order, &bad)
	if len(bad) > 0 {
		return nil, errors.Join(bad...)
	}
	return d, nil
}

// checkRequired checks the fields that need no catalogue.
func (c *Config) checkRequired(bad *problems) {
	if c.AccountID == "" {
		bad.add("account_id is required")
	}
	if c.ZoneID == "" {
		bad.add("zone_id is required")
	}
	if c.Hostname == "" {
		bad.add("hostname is required")
	}
	if c.SteeringPolicy != SteeringGeo && c.SteeringPolicy != SteeringProximity {
		bad.add("steering_policy %q: want %q or %q", c.SteeringPolicy, SteeringGeo, SteeringProximity)
	}
	if !strings.HasPrefix(c.Monitor.Path, "/") {
		bad.add("monitor.path %q must start with /", c.Monitor.Path)
	}
}

// signalingRegions returns the catalogue's regions with a cluster (so with
// signaling), sorted, and checks that the config's regions are exactly
// those, each with origins and a valid pool name.
func (c *Config) signalingRegions(cat *geo.Catalogue, bad *problems) []string {
	var names []string
	for _, r := range cat.Regions {
		if len(r.Clusters) == 0 {
			continue // a POP-only region runs no signaling
		}
		names = append(names, r.Name)
		if _, ok := c.Regions[r.Name]; !ok {
			bad.add("region %q of the catalogue has no entry under regions", r.Name)
		}
	}
	sort.Strings(names)
	for name, rc := range c.Regions {
		if r, ok := cat.Region(name); !ok {
			bad.add("region %q is not in the catalogue", name)
		} else if len(r.Clusters) == 0 {
			bad.add("region %q has no cluster in the catalogue, so no signaling to steer to", name)
		}
		if len(rc.Origins) == 0 {
			bad.add("region %q: no origins", name)
		}
		if !poolNameRe.MatchString(c.NamePrefix + "-" + name) {
			bad.add("pool name %q: only letters, digits, - and _ are allowed", c.NamePrefix+"-"+name)
		}
	}
	return names
}

// checkRegions are the Cloudflare regions the monitor probes from, sorted:
// those the clients come from (the regions' claims), unless the config
// lists its own.
func (c *Config) checkRegions(bad *problems) []string {
	codes := map[string]bool{}
	if len(c.CheckRegions) > 0 {
		for _, code := range c.CheckRegions {
			if !ValidRegionCode(code) {
				bad.add("check_regions: %q is not a Cloudflare region code (%s)", code, regionCodeHint(code))
			}
			codes[code] = true
		}
		return slices.Sorted(maps.Keys(codes))
	}
	for _, rc := range c.Regions {
		for _, code := range rc.CloudflareRegions {
			if ValidRegionCode(strings.ToUpper(code)) {
				codes[strings.ToUpper(code)] = true
			}
		}
	}
	if len(codes) == 0 {
		bad.add("check_regions: no region claims a Cloudflare region code, so list the regions to probe from " +
			"(sync never sends null: that probes from every data centre, which only Enterprise plans allow)")
	}
	return slices.Sorted(maps.Keys(codes))
}

func (c *Config) monitor() monitorSpec {
	return monitorSpec{
		Description:   c.describe("signaling readiness for " + c.Hostname),
		Path:          c.Monitor.Path,
		ExpectedCodes: c.Monitor.ExpectedCodes,
		Host:          c.Hostname,
		Port:          c.Monitor.Port,
		Interval:      c.Monitor.Interval,
		Timeout:       c.Monitor.Timeout,
		Retries:       c.Monitor.Retries,
	}
}

// pools is one pool per region with signaling and an entry, by region name.
func (c *Config) pools(cat *geo.Catalogue, names, checkRegions []string, bad *problems) []poolSpec {
	var pools []poolSpec
	for _, name := range names {
		rc, ok := c.Regions[name]
		if !ok {
			continue
		}
		r, _ := cat.Region(name)
		p := poolSpec{
			Region:       name,
			Name:         c.NamePrefix + "-" + name,
			Description:  c.describe("signaling pool of region " + name),
			Latitude:     r.Location.Lat,
			Longitude:    r.Location.Lon,
			CheckRegions: checkRegions,
		}
		seen := map[string]bool{}
		for i, addr := range rc.Origins {
			if addr == "" || seen[addr] {
				bad.add("region %q: origin %d empty or repeated", name, i+1)
			}
			seen[addr] = true
			p.Origins = append(p.Origins, originSpec{Name: fmt.Sprintf("%s-%d", name, i+1), Address: addr})
		}
		pools = append(pools, p)
	}
	return pools
}

// failoverOrder is the listed regions, then the rest by name.
func (c *Config) failoverOrder(names []string, bad *problems) []string {
	var order []string
	for _, r := range c.RegionOrder {
		if !slices.Contains(names, r) {
			bad.add("region_order names %q, not a region with signaling", r)
			continue
		}
		if !slices.Contains(order, r) {
			order = append(order, r)
		}
	}
	for _, r := range names {
		if !slices.Contains(order, r) {
			order = append(order, r)
		}
	}
	return order
}

// failover is a steered region's own pool first, then the others in
// failover order.
func failover(r string, order []string) []string {
	out := []string{r}
	for _, o := range order {
		if o != r {
			out = append(out, o)
		}
	}
	return out
}

func (c *Config) loadBalancer(cat *geo.Catalogue, names, order []string, bad *problems) lbSpec {
	fallback := cmp.Or(c.FallbackRegion, cat.DefaultRegion)
	if !slices.Contains(names, fallback) {
		bad.add("fallback region %q is not a region with signaling", fallback)
	}
	lb := lbSpec{
		Name:           strings.ToLower(c.Hostname),
		Description:    c.describe("signaling front steering"),
		Proxied:        *c.Proxied,
		TTL:            c.TTL,
		Steering:       c.SteeringPolicy,
		DefaultRegions: order,
		FallbackRegion: fallback,
		RegionPools:    map[string][]string{},
		CountryPools:   map[string][]string{},

		VisitorLocationHeaders: *c.VisitorLocationHeaders,
	}
	c.checkCodes(bad)
	if c.SteeringPolicy == SteeringGeo {
		c.geoPools(&lb, cat, names, order, bad)
	}
	return lb
}

// checkCodes checks the regions' Cloudflare region and country codes
// whatever the policy, so switching to geo later cannot surface a bad code
// at apply time.
func (c *Config) checkCodes(bad *problems) {
	for _, name := range slices.Sorted(maps.Keys(c.Regions)) {
		for _, code := range c.Regions[name].CloudflareRegions {
			if code = strings.ToUpper(code); !ValidRegionCode(code) {
				bad.add("region %q: %q is not a Cloudflare region code (%s)", name, code, regionCodeHint(code))
			}
		}
		for _, code := range c.Regions[name].Countries {
			if code = strings.ToUpper(code); !geo.KnownCountry(code) {
				bad.add("region %q: country %q is not an ISO 3166-1 alpha-2 code", name, code)
			}
		}
	}
}

// geoPools fills the load balancer's region and country pools from the
// regions' claims (each code claimed once) and the catalogue's steering.
func (c *Config) geoPools(lb *lbSpec, cat *geo.Catalogue, names, order []string, bad *problems) {
	claim := func(m map[string][]string, kind, code, region string) {
		if prev, ok := m[code]; ok {
			bad.add("%s %q is claimed by both %q and %q", kind, code, prev[0], region)
			return
		}
		m[code] = failover(region, order)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Regions)) {
		for _, code := range c.Regions[name].CloudflareRegions {
			claim(lb.RegionPools, "Cloudflare region", strings.ToUpper(code), name)
		}
		for _, code := range c.Regions[name].Countries {
			claim(lb.CountryPools, "country", strings.ToUpper(code), name)
		}
	}
	// The catalogue's steering overrides, so Cloudflare sends a country to
	// the front signaling itself would choose for it.
	for cc, prefs := range steeringCountryPools(cat, names, order) {
		if _, ok := lb.CountryPools[cc]; ok {
			bad.add("country %q is steered both by a region's countries here and by the catalogue's steering; keep one", cc)
			continue
		}
		lb.CountryPools[cc] = prefs
	}
}

// steeringCountryPools turns the catalogue's steering overrides into
// country pools: each country (continent entries expanded to their
// countries, a country's own entry winning) gets its preferred regions that
// have signaling, then the rest in failover order.
func steeringCountryPools(cat *geo.Catalogue, withSignaling, order []string) map[string][]string {
	out := map[string][]string{}
	add := func(cc string, prefs []string) {
		var list []string
		for _, r := range prefs {
			if slices.Contains(withSignaling, r) {
				list = append(list, r)
			}
		}
		if len(list) == 0 {
			return
		}
		for _, r := range order {
			if !slices.Contains(list, r) {
				list = append(list, r)
			}
		}
		out[cc] = list
	}
	for cont, prefs := range cat.Steering.Continents {
		for _, cc := range geo.CountriesOf(cont) {
			if _, own := cat.Steering.Countries[cc]; !own {
				add(cc, prefs)
			}
		}
	}
	for cc, prefs := range cat.Steering.Countries {
		add(cc, prefs)
	}
	return out
}
