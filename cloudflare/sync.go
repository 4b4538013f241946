package cloudflare

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"

	cf "github.com/cloudflare/cloudflare-go/v6"
	"github.com/cloudflare/cloudflare-go/v6/load_balancers"
	"github.com/cloudflare/cloudflare-go/v6/managed_transforms"
	"github.com/cloudflare/cloudflare-go/v6/option"

	"github.com/rtcedge/rtcedge/geo"
)

// ErrNotOwned is returned when an object sync would have to change exists
// but was not created by sync (its description lacks the ownership tag).
var ErrNotOwned = errors.New("exists but is not managed by rtcedge-cloudflare sync")

// Action is one change in a plan.
type Action struct {
	Verb    string   // "create", "update" or "delete"
	Object  string   // e.g. "pool rtcedge-eu-central"
	Changes []string // for updates: "field: old -> new"
}

func (a Action) String() string {
	s := a.Verb + " " + a.Object
	for _, c := range a.Changes {
		s += "\n    " + c
	}
	return s
}

// Plan is what a sync did, or with DryRun would do. An empty plan means
// Cloudflare already matches.
type Plan []Action

// WritePlan prints the plan, one action per line ("no changes" when empty).
func (p Plan) WritePlan(w io.Writer) error {
	if len(p) == 0 {
		_, err := fmt.Fprintln(w, "no changes: Cloudflare matches the catalogue")
		return err
	}
	for _, a := range p {
		if _, err := fmt.Fprintln(w, a.String()); err != nil {
			return err
		}
	}
	return nil
}

// Syncer reconciles Cloudflare with a config and catalogue.
type Syncer struct {
	cfg    *Config
	want   *desiredState
	lbs    *load_balancers.LoadBalancerService
	mts    *managed_transforms.ManagedTransformService
	dryRun bool
}

// New checks cfg against the catalogue and returns a Syncer that calls
// Cloudflare's API with token. opts go to cloudflare-go after the defaults
// (option.WithBaseURL points it elsewhere, e.g. at a test server). With
// dryRun the Syncer only reads and reports the plan.
func New(cfg *Config, cat *geo.Catalogue, token string, dryRun bool, opts ...option.RequestOption) (*Syncer, error) {
	if token == "" {
		return nil, errors.New("cloudflare sync: no API token")
	}
	want, err := cfg.desired(cat)
	if err != nil {
		return nil, err
	}
	// The service alone, not cf.NewClient: the client would also pick up
	// CLOUDFLARE_API_KEY / CLOUDFLARE_BASE_URL and friends from the
	// environment, and the token must be the only credential used.
	all := append([]option.RequestOption{option.WithEnvironmentProduction(), option.WithAPIToken(token)}, opts...)
	return &Syncer{
		cfg: cfg, want: want, dryRun: dryRun,
		lbs: load_balancers.NewLoadBalancerService(all...),
		mts: managed_transforms.NewManagedTransformService(all...),
	}, nil
}

// Sync brings Cloudflare in line: monitor, then pools (they reference the
// monitor), then the load balancer (it references the pools), then deletes
// pools it owns that no region wants any more (only now unreferenced), then
// turns on the zone's visitor location headers. It returns the actions
// taken, or with dry run the ones it would take. On an error the plan holds
// what was done before it.
//
// Updates are PATCHes of the fields sync manages, computed from what was
// read (read-modify-write for the monitor's headers and the pool's
// origins), so what someone added by hand — pop_pools, rules,
// adaptive_routing, notification settings, an origin's port — survives.
func (s *Syncer) Sync(ctx context.Context) (Plan, error) {
	var plan Plan
	monitorID, err := s.syncMonitor(ctx, &plan)
	if err != nil {
		return plan, err
	}
	poolIDs, stale, err := s.syncPools(ctx, monitorID, &plan)
	if err != nil {
		return plan, err
	}
	if err := s.syncLoadBalancer(ctx, poolIDs, &plan); err != nil {
		return plan, err
	}
	for _, p := range stale {
		plan = append(plan, Action{Verb: "delete", Object: "pool " + p.Name})
		if s.dryRun {
			continue
		}
		if _, err := s.lbs.Pools.Delete(ctx, p.ID, load_balancers.PoolDeleteParams{AccountID: cf.F(s.cfg.AccountID)}); err != nil {
			return plan, apiError("delete pool "+p.Name, err)
		}
	}
	if s.want.LB.VisitorLocationHeaders {
		if err := s.syncVisitorLocationHeaders(ctx, &plan); err != nil {
			return plan, err
		}
	}
	return plan, nil
}

// visitorLocationTransform is the managed request transform that adds
// CF-IPLatitude, CF-IPLongitude, CF-IPCity, CF-IPContinent and friends.
const visitorLocationTransform = "add_visitor_location_headers"

// syncVisitorLocationHeaders enables the managed transform when it is off.
// The PATCH names only that transform, so the zone's others keep their
// state.
func (s *Syncer) syncVisitorLocationHeaders(ctx context.Context, plan *Plan) error {
	object := "managed transform " + visitorLocationTransform
	list, err := s.mts.List(ctx, managed_transforms.ManagedTransformListParams{ZoneID: cf.F(s.cfg.ZoneID)})
	if err != nil {
		return apiError("list managed transforms", err)
	}
	var found *managed_transforms.ManagedTransformListResponseManagedRequestHeader
	for i, h := range list.ManagedRequestHeaders {
		if h.ID == visitorLocationTransform {
			found = &list.ManagedRequestHeaders[i]
		}
	}
	switch {
	case found == nil:
		return fmt.Errorf("cloudflare: zone %s offers no %s; set visitor_location_headers: false and enable it by hand", s.cfg.ZoneID, object)
	case found.Enabled:
		return nil
	case found.HasConflict:
		return fmt.Errorf("cloudflare: %s conflicts with the enabled %s; disable those or set visitor_location_headers: false",
			object, strings.Join(found.ConflictsWith, ", "))
	}
	*plan = append(*plan, Action{Verb: "update", Object: object, Changes: []string{"enabled: false -> true"}})
	if s.dryRun {
		return nil
	}
	_, err = s.mts.Edit(ctx, managed_transforms.ManagedTransformEditParams{
		ZoneID: cf.F(s.cfg.ZoneID),
		ManagedRequestHeaders: cf.F([]managed_transforms.ManagedTransformEditParamsManagedRequestHeader{
			{ID: cf.F(visitorLocationTransform), Enabled: cf.F(true)},
		}),
		// Required by the API even when nothing changes there.
		ManagedResponseHeaders: cf.F([]managed_transforms.ManagedTransformEditParamsManagedResponseHeader{}),
	})
	if err != nil {
		return apiError("enable "+object, err)
	}
	return nil
}

// placeholder stands for the ID of an object a dry run would create.
func placeholder(what string) string { return "<new " + what + ">" }

func (s *Syncer) syncMonitor(ctx context.Context, plan *Plan) (string, error) {
	want := s.want.Monitor
	page, err := s.lbs.Monitors.List(ctx, load_balancers.MonitorListParams{AccountID: cf.F(s.cfg.AccountID)})
	if err != nil {
		return "", apiError("list monitors", err)
	}
	// The description names the hostname, so it identifies our monitor.
	var found *load_balancers.Monitor
	for i, m := range page.Result {
		if m.Description == want.Description {
			if found != nil {
				return "", fmt.Errorf("monitors %s and %s both carry %q; delete one", found.ID, m.ID, want.Description)
			}
			found = &page.Result[i]
		}
	}
	object := "monitor " + want.Path + " for " + want.Host
	if found == nil {
		*plan = append(*plan, Action{Verb: "create", Object: object})
		if s.dryRun {
			return placeholder("monitor"), nil
		}
		m, err := s.lbs.Monitors.New(ctx, s.monitorNewParams())
		if err != nil {
			return "", apiError("create "+object, err)
		}
		return m.ID, nil
	}
	changes := diffMonitor(*found, want)
	if len(changes) == 0 {
		return found.ID, nil
	}
	*plan = append(*plan, Action{Verb: "update", Object: object, Changes: changes})
	if !s.dryRun {
		p := s.monitorNewParams()
		// Headers added by hand stay; only Host is ours.
		header := map[string][]string{}
		for k, v := range found.Header {
			if !strings.EqualFold(k, "Host") {
				header[k] = v
			}
		}
		header["Host"] = []string{want.Host}
		_, err := s.lbs.Monitors.Edit(ctx, found.ID, load_balancers.MonitorEditParams{
			AccountID: p.AccountID, Type: cf.F(load_balancers.MonitorEditParamsTypeHTTPS),
			Method: p.Method, Path: p.Path, ExpectedCodes: p.ExpectedCodes, Port: p.Port,
			Interval: p.Interval, Timeout: p.Timeout, Retries: p.Retries, Header: cf.F(header),
			FollowRedirects: p.FollowRedirects, AllowInsecure: p.AllowInsecure,
		})
		if err != nil {
			return "", apiError("update "+object, err)
		}
	}
	return found.ID, nil
}

func (s *Syncer) monitorNewParams() load_balancers.MonitorNewParams {
	m := s.want.Monitor
	return load_balancers.MonitorNewParams{
		AccountID:     cf.F(s.cfg.AccountID),
		Description:   cf.F(m.Description),
		Type:          cf.F(load_balancers.MonitorNewParamsTypeHTTPS),
		Method:        cf.F("GET"),
		Path:          cf.F(m.Path),
		ExpectedCodes: cf.F(m.ExpectedCodes),
		Port:          cf.F(m.Port),
		Interval:      cf.F(m.Interval),
		Timeout:       cf.F(m.Timeout),
		Retries:       cf.F(m.Retries),
		// The origins serve several names; Host picks the signaling front
		// and lets certificate verification succeed.
		Header:          cf.F(map[string][]string{"Host": {m.Host}}),
		FollowRedirects: cf.F(false),
		AllowInsecure:   cf.F(false),
	}
}

func diffMonitor(have load_balancers.Monitor, want monitorSpec) []string {
	var d differ
	d.str("type", string(have.Type), "https")
	d.str("method", have.Method, "GET")
	d.str("path", have.Path, want.Path)
	d.str("expected_codes", have.ExpectedCodes, want.ExpectedCodes)
	d.num("port", float64(have.Port), float64(want.Port))
	d.num("interval", float64(have.Interval), float64(want.Interval))
	d.num("timeout", float64(have.Timeout), float64(want.Timeout))
	d.num("retries", float64(have.Retries), float64(want.Retries))
	d.list("header Host", headerValues(have.Header, "Host"), []string{want.Host})
	d.flag("follow_redirects", have.FollowRedirects, false)
	d.flag("allow_insecure", have.AllowInsecure, false)
	return d.changes
}

// headerValues reads a header from the API's map, whose key case the API
// may normalise.
func headerValues(h map[string][]string, name string) []string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return nil
}

type ownedPool struct{ ID, Name string }

func (s *Syncer) syncPools(ctx context.Context, monitorID string, plan *Plan) (ids map[string]string, stale []ownedPool, err error) {
	page, err := s.lbs.Pools.List(ctx, load_balancers.PoolListParams{AccountID: cf.F(s.cfg.AccountID)})
	if err != nil {
		return nil, nil, apiError("list pools", err)
	}
	byName := map[string]load_balancers.Pool{}
	for _, p := range page.Result {
		byName[p.Name] = p
	}
	ids = map[string]string{}
	wanted := map[string]bool{}
	for _, want := range s.want.Pools {
		wanted[want.Name] = true
		object := "pool " + want.Name
		have, ok := byName[want.Name]
		if !ok {
			*plan = append(*plan, Action{Verb: "create", Object: object})
			if s.dryRun {
				ids[want.Region] = placeholder(object)
				continue
			}
			p := s.poolParams(want, monitorID, nil)
			created, err := s.lbs.Pools.New(ctx, load_balancers.PoolNewParams{
				AccountID: p.AccountID, Name: cf.F(want.Name), Description: p.Description, Enabled: p.Enabled,
				MinimumOrigins: p.MinimumOrigins, Monitor: p.Monitor, Latitude: p.Latitude,
				Longitude: p.Longitude, Origins: p.Origins,
			},
				// cloudflare-go's create parameters lack check_regions,
				// which the API takes on create as on update.
				option.WithJSONSet("check_regions", want.CheckRegions))
			if err != nil {
				return nil, nil, apiError("create "+object, err)
			}
			ids[want.Region] = created.ID
			continue
		}
		if !s.cfg.owns(have.Description) {
			return nil, nil, fmt.Errorf("%s (%s): %w; rename it or set name_prefix", object, have.ID, ErrNotOwned)
		}
		ids[want.Region] = have.ID
		changes := diffPool(have, want, monitorID, s.want.Monitor.Host)
		if len(changes) == 0 {
			continue
		}
		*plan = append(*plan, Action{Verb: "update", Object: object, Changes: changes})
		if s.dryRun {
			continue
		}
		if _, err := s.lbs.Pools.Edit(ctx, have.ID, s.poolParams(want, monitorID, have.Origins)); err != nil {
			return nil, nil, apiError("update "+object, err)
		}
	}
	for _, p := range page.Result {
		if !wanted[p.Name] && s.cfg.owns(p.Description) && strings.HasPrefix(p.Name, s.cfg.NamePrefix+"-") {
			stale = append(stale, ownedPool{ID: p.ID, Name: p.Name})
		}
	}
	sort.Slice(stale, func(i, j int) bool { return stale[i].Name < stale[j].Name })
	return ids, stale, nil
}

// poolParams is every pool field sync manages, for a create or a PATCH.
// have holds the pool's current origins: the fields of a same-named origin
// that sync does not manage (port, virtual network, CNAME flattening) are
// carried over, as the origins list is replaced as a whole.
func (s *Syncer) poolParams(want poolSpec, monitorID string, have []load_balancers.Origin) load_balancers.PoolEditParams {
	origins := make([]load_balancers.OriginParam, 0, len(want.Origins))
	for _, o := range want.Origins {
		p := load_balancers.OriginParam{
			Name:    cf.F(o.Name),
			Address: cf.F(o.Address),
			Enabled: cf.F(true),
			Weight:  cf.F(1.0),
			Header:  cf.F(load_balancers.HeaderParam{Host: cf.F([]string{s.want.Monitor.Host})}),
		}
		for _, h := range have {
			if h.Name != o.Name {
				continue
			}
			if h.Port != 0 {
				p.Port = cf.F(h.Port)
			}
			if h.VirtualNetworkID != "" {
				p.VirtualNetworkID = cf.F(h.VirtualNetworkID)
			}
			if h.FlattenCNAME {
				p.FlattenCNAME = cf.F(true)
			}
		}
		origins = append(origins, p)
	}
	checkRegions := make([]load_balancers.CheckRegion, len(want.CheckRegions))
	for i, r := range want.CheckRegions {
		checkRegions[i] = load_balancers.CheckRegion(r)
	}
	return load_balancers.PoolEditParams{
		AccountID:      cf.F(s.cfg.AccountID),
		CheckRegions:   cf.F(checkRegions),
		Description:    cf.F(want.Description),
		Enabled:        cf.F(true),
		MinimumOrigins: cf.F(int64(1)),
		Monitor:        cf.F(monitorID),
		// Proximity steering places the pool here; geo steering ignores it.
		Latitude:  cf.F(want.Latitude),
		Longitude: cf.F(want.Longitude),
		Origins:   cf.F(origins),
	}
}

func diffPool(have load_balancers.Pool, want poolSpec, monitorID, host string) []string {
	var d differ
	d.str("description", have.Description, want.Description)
	d.flag("enabled", have.Enabled, true)
	d.num("minimum_origins", float64(have.MinimumOrigins), 1)
	d.str("monitor", have.Monitor, monitorID)
	d.num("latitude", have.Latitude, want.Latitude)
	d.num("longitude", have.Longitude, want.Longitude)
	haveOrigins := make([]string, 0, len(have.Origins))
	for _, o := range have.Origins {
		haveOrigins = append(haveOrigins, fmt.Sprintf("%s=%s enabled=%t weight=%g host=%s",
			o.Name, o.Address, o.Enabled, o.Weight, strings.Join(o.Header.Host, ",")))
	}
	wantOrigins := make([]string, 0, len(want.Origins))
	for _, o := range want.Origins {
		wantOrigins = append(wantOrigins, fmt.Sprintf("%s=%s enabled=true weight=1 host=%s", o.Name, o.Address, host))
	}
	sort.Strings(haveOrigins)
	sort.Strings(wantOrigins)
	d.list("origins", haveOrigins, wantOrigins)
	haveRegions := make([]string, len(have.CheckRegions))
	for i, r := range have.CheckRegions {
		haveRegions[i] = string(r)
	}
	sort.Strings(haveRegions)
	d.list("check_regions", haveRegions, want.CheckRegions)
	return d.changes
}

func (s *Syncer) syncLoadBalancer(ctx context.Context, poolIDs map[string]string, plan *Plan) error {
	want := s.want.LB
	page, err := s.lbs.List(ctx, load_balancers.LoadBalancerListParams{ZoneID: cf.F(s.cfg.ZoneID)})
	if err != nil {
		return apiError("list load balancers", err)
	}
	object := "load balancer " + want.Name
	var found *load_balancers.LoadBalancer
	for i, lb := range page.Result {
		if strings.EqualFold(strings.TrimSuffix(lb.Name, "."), want.Name) {
			found = &page.Result[i]
			break
		}
	}
	params := s.loadBalancerParams(poolIDs)
	if found == nil {
		*plan = append(*plan, Action{Verb: "create", Object: object})
		if s.dryRun {
			return nil
		}
		_, err := s.lbs.New(ctx, load_balancers.LoadBalancerNewParams{
			ZoneID: params.ZoneID, Name: cf.F(want.Name), Description: params.Description,
			Proxied: params.Proxied, SteeringPolicy: params.SteeringPolicy, SessionAffinity: params.SessionAffinity,
			DefaultPools: params.DefaultPools, FallbackPool: params.FallbackPool,
			RegionPools: params.RegionPools, CountryPools: params.CountryPools, TTL: params.TTL,
		})
		if err != nil {
			return apiError("create "+object, err)
		}
		return nil
	}
	if !s.cfg.owns(found.Description) {
		return fmt.Errorf("%s (%s): %w", object, found.ID, ErrNotOwned)
	}
	changes := diffLoadBalancer(*found, want, params)
	if len(changes) == 0 {
		return nil
	}
	*plan = append(*plan, Action{Verb: "update", Object: object, Changes: changes})
	if s.dryRun {
		return nil
	}
	if _, err := s.lbs.Edit(ctx, found.ID, params); err != nil {
		return apiError("update "+object, err)
	}
	return nil
}

// loadBalancerParams is every load balancer field sync manages: a PATCH of
// these leaves pop_pools, rules, adaptive_routing and the rest as they are.
func (s *Syncer) loadBalancerParams(poolIDs map[string]string) load_balancers.LoadBalancerEditParams {
	want := s.want.LB
	ids := func(regions []string) []string {
		out := make([]string, len(regions))
		for i, r := range regions {
			out[i] = poolIDs[r]
		}
		return out
	}
	steer := func(m map[string][]string) map[string][]string {
		out := make(map[string][]string, len(m))
		for k, regions := range m {
			out[k] = ids(regions)
		}
		return out
	}
	params := load_balancers.LoadBalancerEditParams{
		ZoneID:         cf.F(s.cfg.ZoneID),
		Description:    cf.F(want.Description),
		Enabled:        cf.F(true),
		Proxied:        cf.F(want.Proxied),
		SteeringPolicy: cf.F(load_balancers.SteeringPolicy(want.Steering)),
		// Signaling is stateless: any request may go to any front.
		SessionAffinity: cf.F(load_balancers.SessionAffinityNone),
		DefaultPools:    cf.F(ids(want.DefaultRegions)),
		FallbackPool:    cf.F(poolIDs[want.FallbackRegion]),
		// Sent even when empty, so switching to proximity clears them.
		RegionPools:  cf.F(steer(want.RegionPools)),
		CountryPools: cf.F(steer(want.CountryPools)),
	}
	if !want.Proxied {
		params.TTL = cf.F(float64(want.TTL))
	}
	return params
}

// diffLoadBalancer compares the load balancer with want, whose pools p
// holds as IDs.
func diffLoadBalancer(have load_balancers.LoadBalancer, want lbSpec, p load_balancers.LoadBalancerEditParams) []string {
	var d differ
	d.str("description", have.Description, want.Description)
	d.flag("enabled", have.Enabled, true)
	d.flag("proxied", have.Proxied, want.Proxied)
	if !want.Proxied {
		d.num("ttl", have.TTL, float64(want.TTL))
	}
	d.str("steering_policy", string(have.SteeringPolicy), want.Steering)
	d.str("session_affinity", cmp.Or(string(have.SessionAffinity), "none"), "none")
	d.list("default_pools", have.DefaultPools, p.DefaultPools.Value)
	d.str("fallback_pool", have.FallbackPool, p.FallbackPool.Value)
	d.steering("region_pools", have.RegionPools, p.RegionPools.Value)
	d.steering("country_pools", have.CountryPools, p.CountryPools.Value)
	return d.changes
}

// differ collects "field: have -> want" lines.
type differ struct{ changes []string }

func (d *differ) add(field string, have, want any) {
	d.changes = append(d.changes, fmt.Sprintf("%s: %v -> %v", field, have, want))
}

func (d *differ) str(field, have, want string) {
	if have != want {
		d.add(field, fmt.Sprintf("%q", have), fmt.Sprintf("%q", want))
	}
}

func (d *differ) num(field string, have, want float64) {
	if have != want {
		d.add(field, have, want)
	}
}

func (d *differ) flag(field string, have, want bool) {
	if have != want {
		d.add(field, have, want)
	}
}

func (d *differ) list(field string, have, want []string) {
	if !slices.Equal(have, want) {
		d.add(field, have, want)
	}
}

// steering compares region/country pool maps; an absent key and an empty
// list mean the same.
func (d *differ) steering(field string, have, want map[string][]string) {
	keys := map[string]bool{}
	for k, v := range have {
		if len(v) > 0 {
			keys[k] = true
		}
	}
	for k, v := range want {
		if len(v) > 0 {
			keys[k] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		d.list(field+"["+k+"]", have[k], want[k])
	}
}

// APIError is a failed API call: what sync was doing, the HTTP status and
// Cloudflare's error codes and messages. It unwraps to cloudflare-go's error.
type APIError struct {
	Doing    string
	Status   int
	Messages []string // "[code] message"
	err      error
}

func (e *APIError) Error() string {
	return fmt.Sprintf("cloudflare: %s: HTTP %d: %s", e.Doing, e.Status, strings.Join(e.Messages, "; "))
}

func (e *APIError) Unwrap() error { return e.err }

// apiError wraps err with what was being done; API errors become *APIError.
func apiError(doing string, err error) error {
	var apiErr *cf.Error
	if !errors.As(err, &apiErr) {
		return fmt.Errorf("cloudflare: %s: %w", doing, err)
	}
	e := &APIError{Doing: doing, Status: apiErr.StatusCode, err: err}
	for _, d := range apiErr.Errors {
		e.Messages = append(e.Messages, fmt.Sprintf("[%d] %s", d.Code, d.Message))
	}
	if len(e.Messages) == 0 {
		e.Messages = []string{"no error detail in the response"}
	}
	return e
}
