package geo

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Catalogue is the static region catalogue: every region with its transceiver
// clusters and global relay POPs. It is loaded once from a YAML file (see
// LoadCatalogue) or built in code and checked with Validate. A Catalogue is
// read-only after construction, so any number of goroutines may use it.
type Catalogue struct {
	// DefaultRegion is where clients go that cannot be located (loopback,
	// private or unknown addresses). DefaultLocation returns its coordinates
	// for use as LocatorConfig.Default.
	DefaultRegion string   `yaml:"default_region" json:"default_region"`
	Regions       []Region `yaml:"regions" json:"regions"`
	// Steering lists places whose network paths do not follow distance,
	// with the regions they should use; see ChooseFor.
	Steering Steering `yaml:"steering" json:"steering,omitempty"`
}

// Steering holds per-country and per-continent region preferences that win
// over great-circle distance, for places whose network paths do not follow
// the map (South Africa reaches Europe faster than South America). Each
// list names regions in order of preference; regions it leaves out follow
// by distance. A country's entry wins over its continent's. The same lists
// become Cloudflare's country pools (rtcedge-cloudflare sync, Terraform), so
// the signaling hostname and the media path steer alike.
type Steering struct {
	// Countries maps ISO 3166-1 alpha-2 codes (upper case) to regions.
	Countries map[string][]string `yaml:"countries" json:"countries,omitempty"`
	// Continents maps continent codes (AF, AN, AS, EU, NA, OC, SA) to
	// regions.
	Continents map[string][]string `yaml:"continents" json:"continents,omitempty"`
}

// Preferred returns the regions a client in country should use first, in
// order: the country's entry, else its continent's, else nil.
func (s Steering) Preferred(country string) []string {
	if r, ok := s.Countries[country]; ok {
		return r
	}
	if cont := ContinentOf(country); cont != "" {
		return s.Continents[cont]
	}
	return nil
}

// Region is a named geographic area holding clusters and POPs.
type Region struct {
	Name     string    `yaml:"name" json:"name"`
	Location Point     `yaml:"location" json:"location"`
	Clusters []Cluster `yaml:"clusters" json:"clusters"`
	POPs     []POP     `yaml:"pops" json:"pops"`
}

// Cluster is one transceiver cluster. Its ID is the cluster id carried in
// routing tokens, so it must be unique and non-zero.
type Cluster struct {
	// ID is 1..65535 and unique across the catalogue.
	ID   uint16 `yaml:"id" json:"id"`
	Name string `yaml:"name" json:"name"`
	// Location defaults to the region's location when absent in the file.
	Location Point `yaml:"location" json:"location"`
	// SessionAPI is the base URL of the cluster's internal session API, e.g.
	// http://127.0.0.1:8081. It may be empty in a catalogue whose addresses
	// are only known at run time (the dev world binds port 0 and fills it in);
	// when set it must be an absolute http or https URL.
	SessionAPI string `yaml:"session_api" json:"session_api"`
	// SessionAPINets are the networks the cluster's session API replicas
	// advertise themselves from in gossip (its pod CIDR). Signaling sends
	// offers only to gossiped endpoints on SessionAPI's host or inside these
	// networks; anything else a member advertises is ignored.
	SessionAPINets []netip.Prefix `yaml:"session_api_nets,omitempty" json:"session_api_nets,omitempty"`
}

// POP is one global relay point of presence: the public UDP VIP clients send
// media to.
type POP struct {
	// ID is 1..65535 and unique across the catalogue.
	ID   uint16 `yaml:"id" json:"id"`
	Name string `yaml:"name" json:"name"`
	// VIP is the public address and port, e.g. 203.0.113.10:3478.
	VIP netip.AddrPort `yaml:"vip" json:"vip"`
	// TCPPort is the POP's ICE-TCP port on the VIP's address (docs/tcp.md;
	// 443 in production); 0: the POP takes no TCP.
	TCPPort uint16 `yaml:"tcp_port" json:"tcp_port,omitempty"`
	// Location defaults to the region's location when absent in the file.
	Location Point `yaml:"location" json:"location"`
}

// The raw* types mirror the public ones with pointers where "absent" must be
// told apart from a zero value (an omitted location inherits the region's;
// a point at 0,0 is a real place).
type (
	rawCatalogue struct {
		DefaultRegion string      `yaml:"default_region"`
		Regions       []rawRegion `yaml:"regions"`
		Steering      Steering    `yaml:"steering"`
	}
	rawRegion struct {
		Name     string       `yaml:"name"`
		Location *rawPoint    `yaml:"location"`
		Clusters []rawCluster `yaml:"clusters"`
		POPs     []rawPOP     `yaml:"pops"`
	}
	rawCluster struct {
		ID         uint16    `yaml:"id"`
		Name       string    `yaml:"name"`
		Location   *rawPoint `yaml:"location"`
		SessionAPI string    `yaml:"session_api"`
	}
	rawPOP struct {
		ID       uint16    `yaml:"id"`
		Name     string    `yaml:"name"`
		VIP      string    `yaml:"vip"` // parsed by build, to name the POP in errors
		TCPPort  uint16    `yaml:"tcp_port"`
		Location *rawPoint `yaml:"location"`
	}
	rawPoint struct {
		Lat *float64 `yaml:"lat"`
		Lon *float64 `yaml:"lon"`
	}
)

// LoadCatalogue reads and parses the catalogue file at path; see
// ParseCatalogue.
func LoadCatalogue(path string) (*Catalogue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load catalogue: %w", err)
	}
	c, err := ParseCatalogue(data)
	if err != nil {
		return nil, fmt.Errorf("load catalogue %s: %w", path, err)
	}
	return c, nil
}

// ParseCatalogue decodes a YAML catalogue strictly (unknown keys, a second
// document, or a point missing lat or lon are errors), fills in defaulted
// locations, and validates the result. All returned errors wrap
// ErrInvalidCatalogue.
func ParseCatalogue(data []byte) (*Catalogue, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var raw rawCatalogue
	if err := dec.Decode(&raw); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document", ErrInvalidCatalogue)
		}
		return nil, fmt.Errorf("%w: decode: %w", ErrInvalidCatalogue, err)
	}
	// A second document would silently be ignored; refuse it so an operator
	// who concatenated files notices.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one YAML document", ErrInvalidCatalogue)
	}

	c, err := raw.build()
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// build converts the decoded form, applying location defaults.
func (r *rawCatalogue) build() (*Catalogue, error) {
	var errs []error
	point := func(p *rawPoint, def Point, what string) Point {
		if p == nil {
			return def
		}
		if p.Lat == nil || p.Lon == nil {
			errs = append(errs, fmt.Errorf("%w: %s: location needs both lat and lon", ErrInvalidCatalogue, what))
			return def
		}
		return Point{Lat: *p.Lat, Lon: *p.Lon}
	}

	c := &Catalogue{DefaultRegion: r.DefaultRegion, Regions: make([]Region, 0, len(r.Regions)), Steering: r.Steering}
	for _, rr := range r.Regions {
		what := fmt.Sprintf("region %q", rr.Name)
		if rr.Location == nil {
			errs = append(errs, fmt.Errorf("%w: %s: location is required", ErrInvalidCatalogue, what))
		}
		reg := Region{Name: rr.Name, Location: point(rr.Location, Point{}, what)}
		for _, rc := range rr.Clusters {
			reg.Clusters = append(reg.Clusters, Cluster{
				ID:         rc.ID,
				Name:       rc.Name,
				Location:   point(rc.Location, reg.Location, fmt.Sprintf("cluster %d", rc.ID)),
				SessionAPI: rc.SessionAPI,
			})
		}
		for _, rp := range rr.POPs {
			var vip netip.AddrPort
			if rp.VIP != "" {
				var err error
				if vip, err = netip.ParseAddrPort(rp.VIP); err != nil {
					errs = append(errs, fmt.Errorf("%w: pop %d: vip %q: %w", ErrInvalidCatalogue, rp.ID, rp.VIP, err))
				}
			}
			reg.POPs = append(reg.POPs, POP{
				ID:       rp.ID,
				Name:     rp.Name,
				VIP:      vip,
				TCPPort:  rp.TCPPort,
				Location: point(rp.Location, reg.Location, fmt.Sprintf("pop %d", rp.ID)),
			})
		}
		c.Regions = append(c.Regions, reg)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Validate checks the catalogue as a whole and reports every problem found,
// each wrapping ErrInvalidCatalogue: region, cluster and POP names non-empty
// and unique (per kind), cluster and POP IDs non-zero and unique, POP VIPs
// valid with a non-zero port, session API URLs absolute http(s) when set,
// coordinates in range, every region with at least one cluster or POP, at
// least one cluster overall, the default region present, and steering
// entries naming known countries or continents and, without repeats, regions
// that have a cluster.
func (c *Catalogue) Validate() error {
	k := catalogueCheck{
		withClusters: map[string]bool{},
		ids:          map[string]map[uint16]bool{"cluster": {}, "pop": {}},
		names:        map[string]map[string]bool{"cluster": {}, "pop": {}},
	}
	nClusters := 0
	for i, r := range c.Regions {
		k.region(i, r)
		nClusters += len(r.Clusters)
	}
	if nClusters == 0 {
		k.fail("at least one cluster is required")
	}
	switch _, ok := k.withClusters[c.DefaultRegion]; {
	case c.DefaultRegion == "":
		k.fail("default_region is required")
	case !ok:
		k.fail("default_region %q is not a region", c.DefaultRegion)
	}
	for _, cc := range sortedKeys(c.Steering.Countries) {
		if !KnownCountry(cc) {
			k.fail("steering countries: %q is not an ISO 3166-1 alpha-2 country code (upper case)", cc)
		}
		k.prefs("countries "+cc, c.Steering.Countries[cc])
	}
	for _, cont := range sortedKeys(c.Steering.Continents) {
		if CountriesOf(cont) == nil {
			k.fail("steering continents: %q is not a continent code (AF, AN, AS, EU, NA, OC, SA)", cont)
		}
		k.prefs("continents "+cont, c.Steering.Continents[cont])
	}
	return errors.Join(k.errs...)
}

// catalogueCheck is one run of Validate: the problems found so far and
// what the later checks compare against.
type catalogueCheck struct {
	errs         []error
	withClusters map[string]bool            // by region name: whether it has clusters
	ids          map[string]map[uint16]bool // by kind ("cluster", "pop")
	names        map[string]map[string]bool // by kind
}

// fail records a problem, wrapping ErrInvalidCatalogue.
func (k *catalogueCheck) fail(format string, args ...any) {
	k.errs = append(k.errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidCatalogue}, args...)...))
}

// unique checks a cluster's or a POP's ID and name: set, and unique among
// its kind.
func (k *catalogueCheck) unique(kind, region string, id uint16, name string) {
	switch {
	case id == 0:
		k.fail("region %q: %s %q: id must be 1..65535", region, kind, name)
	case k.ids[kind][id]:
		k.fail("%s %d: duplicate id", kind, id)
	}
	k.ids[kind][id] = true
	switch {
	case name == "":
		k.fail("%s %d: name is required", kind, id)
	case k.names[kind][name]:
		k.fail("%s %q: duplicate name", kind, name)
	}
	k.names[kind][name] = true
}

// region checks the i-th region, its clusters and its POPs.
func (k *catalogueCheck) region(i int, r Region) {
	switch _, dup := k.withClusters[r.Name]; {
	case r.Name == "":
		k.fail("region #%d: name is required", i+1)
	case dup:
		k.fail("region %q: duplicate name", r.Name)
	}
	k.withClusters[r.Name] = len(r.Clusters) > 0
	if !r.Location.Valid() {
		k.fail("region %q: location %v out of range", r.Name, r.Location)
	}
	if len(r.Clusters) == 0 && len(r.POPs) == 0 {
		k.fail("region %q: needs at least one cluster or pop", r.Name)
	}
	for _, cl := range r.Clusters {
		k.unique("cluster", r.Name, cl.ID, cl.Name)
		if !cl.Location.Valid() {
			k.fail("cluster %d: location %v out of range", cl.ID, cl.Location)
		}
		if cl.SessionAPI != "" {
			if u, err := url.Parse(cl.SessionAPI); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				k.fail("cluster %d: session_api %q is not an absolute http(s) URL", cl.ID, cl.SessionAPI)
			}
		}
	}
	for _, p := range r.POPs {
		k.unique("pop", r.Name, p.ID, p.Name)
		if !p.VIP.IsValid() || p.VIP.Port() == 0 || p.VIP.Addr().IsUnspecified() {
			k.fail("pop %d: vip %q must be a specific address with a non-zero port", p.ID, p.VIP)
		}
		if !p.Location.Valid() {
			k.fail("pop %d: location %v out of range", p.ID, p.Location)
		}
	}
}

// prefs checks a steering preference list: regions that exist, have
// clusters, and are listed once.
func (k *catalogueCheck) prefs(what string, prefs []string) {
	if len(prefs) == 0 {
		k.fail("steering %s: no regions listed", what)
	}
	seen := map[string]bool{}
	for _, name := range prefs {
		switch has, ok := k.withClusters[name]; {
		case !ok:
			k.fail("steering %s: %q is not a region", what, name)
		case !has:
			k.fail("steering %s: region %q has no cluster to steer calls to", what, name)
		case seen[name]:
			k.fail("steering %s: region %q listed twice", what, name)
		}
		seen[name] = true
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The lookups below scan linearly: a catalogue holds tens of entries, and
// keeping no index means a Catalogue built or edited in code cannot go stale.

// Cluster returns the cluster with the given id and the region holding it.
func (c *Catalogue) Cluster(id uint16) (Cluster, Region, bool) {
	for _, r := range c.Regions {
		for _, cl := range r.Clusters {
			if cl.ID == id {
				return cl, r, true
			}
		}
	}
	return Cluster{}, Region{}, false
}

// POP returns the POP with the given id.
func (c *Catalogue) POP(id uint16) (POP, bool) {
	for _, r := range c.Regions {
		for _, p := range r.POPs {
			if p.ID == id {
				return p, true
			}
		}
	}
	return POP{}, false
}

// ClusterRegion returns the name of the region holding cluster id (what
// internal/metacheck asks of a catalogue).
func (c *Catalogue) ClusterRegion(id uint16) (string, bool) {
	_, r, ok := c.Cluster(id)
	return r.Name, ok
}

// HasPOP reports whether a POP with the given id exists.
func (c *Catalogue) HasPOP(id uint16) bool {
	_, ok := c.POP(id)
	return ok
}

// Region returns the region with the given name.
func (c *Catalogue) Region(name string) (Region, bool) {
	for _, r := range c.Regions {
		if r.Name == name {
			return r, true
		}
	}
	return Region{}, false
}

// DefaultLocation returns the location of the default region, meant for
// LocatorConfig.Default so that clients that cannot be located are steered to
// the default region. It returns the zero Point if the region is missing,
// which Validate rules out.
func (c *Catalogue) DefaultLocation() Point {
	r, _ := c.Region(c.DefaultRegion)
	return r.Location
}
