// Package sim runs rtcedge as a simulated multi-region network: the real
// binary, one process per role, two regions and three client sites (one
// whose GeoIP location lies), each on its own loopback addresses, with user-space delay links (package netsim)
// standing in for the distance between them. Tests use it to check that
// each client site is steered to its near region, to measure call setup in
// units of the simulated round trip, and to inject faults (loss bursts,
// partitions) on the same links. `make sim` runs the measurement verbosely;
// docs/simulation.md shows the topology and the measured table.
//
// A signaling answer names one VIP per POP, but distance depends on the
// pair (client site, POP). So every site has its own view of every POP: a
// UDP link on a site address that forwards, after the site's delay to that
// POP's region, to a global relay process of its own (a distinct POP ID, as
// a transceiver binds each POP ID to one VIP). Each site reaches the
// signaling front of its near region through a TCP link, and that front's
// catalogue lists the site's view of the POPs; a front reaches the other
// region's cluster session API through a TCP link with the inter-region
// delay. Gossip is not delayed: it is control-plane background traffic.
package sim

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/internal/testlog"
	"github.com/rtcedge/rtcedge/netsim"
)

// Package is the import path of the binary the simulation runs.
const Package = "github.com/rtcedge/rtcedge/cmd/rtcedge"

// startLimit bounds each process's start (its "… up" log line).
const startLimit = 15 * time.Second

// convergeLimit bounds the wait for gossip to show every cluster healthy and
// every POP up at both signaling fronts.
const convergeLimit = 20 * time.Second

// stopLimit bounds the graceful stop of all processes at the end.
const stopLimit = 15 * time.Second

// Config shapes the simulated network. The zero value is the default
// topology: 10 ms one way between a site and its near region, 80 ms between
// regions.
type Config struct {
	// Binary is the rtcedge binary; default: built once per test binary
	// with proctest.Build.
	Binary string
	// Near is the one-way delay between a client site and its near region
	// (signaling front and POP); default 10 ms.
	Near time.Duration
	// Far is the one-way delay between regions, and so between a site and
	// the far region's POP; default 80 ms.
	Far time.Duration
	// Jitter spreads every link's delay by ± this much; default none.
	Jitter time.Duration
	// Seed seeds the links' loss and jitter draws.
	Seed int64
	// Logger receives the links' logs; default: discarded.
	Logger *slog.Logger
	// SIP gives every site a carrier, its trunk's SIP front and a POP for
	// its media (sip.go); it needs redis-server.
	SIP bool
}

// RegionSpec is one region of the topology.
type RegionSpec struct {
	Name     string  // e.g. "eu-central"
	City     string  // where its cluster and POPs stand
	Lat, Lon float64 // the region's location in the catalogue
	Cluster  uint16  // its one cluster's ID
	POPCode  string  // prefix of its POP names: "fra" → "fra-a" as seen from site a
	Net      byte    // its processes listen on 127.0.Net.x
}

// SiteSpec is one client site of the topology.
type SiteSpec struct {
	Name     string  // e.g. "a"; suffixes the POP names of this site's view
	City     string  // where its clients are
	Lat, Lon float64 // sent as CF-IPLatitude/CF-IPLongitude, as Cloudflare would
	Near     int     // index of its near region in Regions: where its delay links say it is
	Net      byte    // its links listen on 127.0.Net.x
	// GeoWrong: Lat/Lon (its GeoIP location) lie on another continent
	// than its near region; only measured round trips steer it right
	// (docs/steering.md).
	GeoWrong bool
}

// Regions and Sites are the default topology: a European and an American
// region, a client site near each, and a site near the American region
// whose GeoIP location is European.
var (
	Regions = []RegionSpec{
		{Name: "eu-central", City: "Frankfurt", Lat: 50.11, Lon: 8.68, Cluster: 1, POPCode: "fra", Net: 10},
		{Name: "us-east", City: "Ashburn", Lat: 39.04, Lon: -77.49, Cluster: 2, POPCode: "iad", Net: 20},
	}
	Sites = []SiteSpec{
		{Name: "a", City: "Paris", Lat: 48.86, Lon: 2.35, Near: 0, Net: 1},
		{Name: "b", City: "New York", Lat: 40.71, Lon: -74.01, Near: 1, Net: 2},
		// A carrier whose addresses GeoIP places at its Paris headquarters,
		// whose clients are in Boston.
		{Name: "c", City: "Boston (GeoIP: Paris)", Lat: 48.86, Lon: 2.35, Near: 1, Net: 3, GeoWrong: true},
	}
)

// PodsPerRegion is how many transceiver pods each region's cluster has:
// steering believes a POP measured for a caller network only with samples
// from three distinct pods (or probes; docs/steering.md), and a site's
// calls before steering land in one cluster.
const PodsPerRegion = 3

// Region is a running region: its pods, cluster relay and signaling front,
// and the global relays of its POPs (one per site's view).
type Region struct {
	Spec         RegionSpec
	Pods         []*proctest.Proc // PodsPerRegion of them, pod IDs 1, 2, …
	ClusterRelay *proctest.Proc
	// Signaling is the front of the first site near the region (each
	// site has its own, Site.Front); SignalingURL is its own address (no
	// delay), for checks.
	Signaling    *proctest.Proc
	SignalingURL string
	// SessionAPI is the cluster's session API (no delay).
	SessionAPI string
	// RemoteAPI is the link from this region's front to the other
	// region's session API (Far each way).
	RemoteAPI *netsim.TCPLink
}

// POP is one site's view of one region's POP: a global relay process of its
// own behind a UDP link with the site↔region delay, and behind a TCP link
// with the same delay on the same VIP's address for ICE-TCP (docs/tcp.md).
type POP struct {
	ID     uint16
	Name   string // e.g. "fra-a"
	Region int    // index into World.Regions
	Relay  *proctest.Proc
	Link   *netsim.UDPLink // listens on the VIP that answers name
	// TCPLink listens on the VIP's address, on the catalogue's tcp_port;
	// it charges each connection's handshake round trip
	// (netsim.NewTCPLinkWithHandshake).
	TCPLink *netsim.TCPLink
	Delay   time.Duration // one way
	// direct is the VIP of a POP reached without a link (a carrier's,
	// SIPSite.POP): its relay's public address.
	direct netip.AddrPort
}

// VIP is the address the site's clients send to.
func (p *POP) VIP() netip.AddrPort {
	if p.Link == nil {
		return p.direct
	}
	return p.Link.Addr()
}

// TCPAddr is the address the site's ICE-TCP clients connect to.
func (p *POP) TCPAddr() netip.AddrPort { return p.TCPLink.Addr().(*net.TCPAddr).AddrPort() }

// Site is a running client site.
type Site struct {
	Spec SiteSpec
	// Signaling is the TCP link from the site to its near region's
	// signaling front (Near each way); SignalingURL names it.
	Signaling    *netsim.TCPLink
	SignalingURL string
	// Front is the site's signaling front (in its near region, with the
	// catalogue of the site's view of the POPs); FrontURL its own address.
	Front    *proctest.Proc
	FrontURL string
	// POPs are this site's view of every region's POP, by region index.
	POPs []*POP
	// HTTPClient dials from the site's own address and keeps connections
	// alive, as a browser would between calls.
	HTTPClient *http.Client
	// SIP is the site's carrier (Config.SIP, sites whose GeoIP is
	// right), else nil.
	SIP *SIPSite
}

// NearRegion is the index of the site's near region.
func (s *Site) NearRegion() int { return s.Spec.Near }

// NearPOP is the site's view of its near region's POP.
func (s *Site) NearPOP() *POP { return s.POPs[s.Spec.Near] }

// Headers are the visitor-location headers a Cloudflare edge in front of
// signaling would add for this site's clients.
func (s *Site) Headers() http.Header {
	h := http.Header{}
	h.Set("CF-IPLatitude", strconv.FormatFloat(s.Spec.Lat, 'f', 2, 64))
	h.Set("CF-IPLongitude", strconv.FormatFloat(s.Spec.Lon, 'f', 2, 64))
	return h
}

// World is a running simulation. Start registers its teardown with the
// test, so the caller never closes it.
type World struct {
	Config  Config
	Regions []*Region
	Sites   []*Site

	redisURL string // the phone calls' route cache (Config.SIP), else ""
}

// SignalingRTT is the round trip between a site and its signaling front.
func (w *World) SignalingRTT() time.Duration { return 2 * w.Config.Near }

// MediaRTT is the round trip between a site and its near POP.
func (w *World) MediaRTT() time.Duration { return 2 * w.Config.Near }

// addr is 127.0.net.host with port 0.
func addr(net, host byte) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, net, host}), 0)
}

// Host numbers within a region's or a site's 127.0.Net.0/24.
const (
	hostClusterRelay = 2
	hostSignaling    = 5  // + site index: that site's front
	hostRemoteAPI    = 9  // the region's link to the other region's session API
	hostRelayBase    = 11 // + site index: that site's view of this region's POP
	hostSiteSig      = 1  // the site's link to its signaling front
	hostSitePOPBase  = 2  // + region index: the site's VIP of that region's POP
	hostSiteClient   = 100
)

// hostPods are the host numbers of a region's pods.
var hostPods = [PodsPerRegion]byte{1, 3, 4}

// Start builds (once) and starts the whole topology and returns when every
// process is up and gossip has converged: both signaling fronts see both
// clusters healthy and all their POPs up. Everything is stopped in
// t.Cleanup: the links first, then the processes with SIGTERM (which must
// exit cleanly), killed if they do not.
func Start(t testing.TB, cfg Config) *World {
	t.Helper()
	cfg.Near = cmp.Or(cfg.Near, 10*time.Millisecond)
	cfg.Far = cmp.Or(cfg.Far, 80*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.Binary == "" {
		cfg.Binary = proctest.Build(t, Package)
	}
	w := &World{Config: cfg}
	s := &starter{t: t, w: w, dir: t.TempDir()}
	s.auth, s.env = authorityKeys(t)
	if cfg.SIP {
		s.redisURL = startRedis(t)
		w.redisURL = s.redisURL
	}
	t.Cleanup(s.stopLinks)
	seed := s.startClusters()
	s.startPOPs(seed)
	s.startSignaling(seed)
	if cfg.SIP {
		s.startSIP(seed)
	}
	// Registered after every process's own kill-and-reap cleanup, so it
	// runs first: a clean exit on SIGTERM is part of what is tested.
	t.Cleanup(func() { proctest.StopAll(t, stopLimit, s.procs...) })
	for _, site := range w.Sites {
		w.awaitConverged(t, site.FrontURL)
	}
	return w
}

// authorityKeys issues the deployment authority's secrets of every
// region's cluster from a fresh root (internal/authority): the relays
// read them from the environment, each pod only its own keys from the
// file podKeys writes, as in production (docs/operations.md).
func authorityKeys(t testing.TB) (*authority.Secrets, []string) {
	root := make([]byte, authority.KeyLen)
	if _, err := rand.Read(root); err != nil {
		t.Fatalf("sim: authority root: %v", err)
	}
	var specs []string
	for _, spec := range Regions {
		specs = append(specs, authority.Spec(spec.Cluster, 1, authority.ClusterSecret(root, spec.Cluster)))
	}
	sec, err := authority.Parse(specs)
	if err != nil {
		t.Fatalf("sim: authority: %v", err)
	}
	return sec, []string{node.EnvAuthorityKeys + "=" + strings.Join(specs, ",")}
}

// podKeys writes the keys the authority issues pod of cluster and returns
// the file's path.
func (s *starter) podKeys(cluster, pod uint16) string {
	k, err := s.auth.Pod(cluster, pod)
	if err != nil {
		s.t.Fatalf("sim: pod keys: %v", err)
	}
	path := filepath.Join(s.dir, fmt.Sprintf("pod-keys-%d-%d.yaml", cluster, pod))
	if err := k.WriteFile(path); err != nil {
		s.t.Fatalf("sim: %v", err)
	}
	return path
}

// startClusters starts each region's pods (the first seeds the others'
// cluster pool), then its cluster relay, which joins the pods' cluster
// pool; it returns the first cluster relay's global gossip address, which
// seeds everyone's global pool.
func (s *starter) startClusters() (seed string) {
	t, w := s.t, s.w
	for _, spec := range Regions {
		w.Regions = append(w.Regions, &Region{Spec: spec})
	}
	startPod := func(r *Region, i int, join string) {
		a := addr(r.Spec.Net, hostPods[i])
		name := fmt.Sprintf("%s-pod-%d", r.Spec.Name, i+1)
		r.Pods = append(r.Pods, s.start("transceiver-"+name, "transceiver", fmt.Sprintf(
			"region: %s\ncluster: %d\npod: %d\npod_keys: %q\ndata_addr: %q\napi_addr: %q\ndrain_timeout: 2s\nredis_url: %q\n%s",
			r.Spec.Name, r.Spec.Cluster, i+1, s.podKeys(r.Spec.Cluster, uint16(i+1)), a, a, s.redisURL, gossip("gossip", name, a.Addr(), join))))
	}
	for _, r := range w.Regions {
		startPod(r, 0, "")
	}
	podSeeds := map[*Region]string{}
	for _, r := range w.Regions {
		podSeeds[r] = r.Pods[0].WaitLog(t, "transceiver up", startLimit)["gossip"]
		for i := 1; i < PodsPerRegion; i++ {
			startPod(r, i, podSeeds[r])
		}
	}
	for _, r := range w.Regions {
		for _, p := range r.Pods[1:] {
			p.WaitLog(t, "transceiver up", startLimit)
		}
		podGossip := podSeeds[r]
		a := addr(r.Spec.Net, hostClusterRelay)
		r.ClusterRelay = s.start("clusterrelay-"+r.Spec.Name, "clusterrelay", fmt.Sprintf(
			"region: %s\ncluster: %d\ndata_addr: %q\napi_addr: %q\ndrain_timeout: 1s\n%s%s",
			r.Spec.Name, r.Spec.Cluster, a, a,
			gossip("cluster_gossip", r.Spec.Name+"-cr-1", a.Addr(), podGossip),
			gossip("global_gossip", r.Spec.Name+"-cr-1", a.Addr(), seed)))
		up := r.ClusterRelay.WaitLog(t, "cluster relay up", startLimit)
		r.SessionAPI = up["api"]
		if seed == "" {
			seed = up["global_gossip"]
		}
	}
	return seed
}

// startPOPs starts one global relay per (site, region), a site's view of
// that POP, and the site's links to them.
func (s *starter) startPOPs(seed string) {
	t, w := s.t, s.w
	for si, spec := range Sites {
		site := &Site{Spec: spec}
		w.Sites = append(w.Sites, site)
		for ri, r := range w.Regions {
			p := &POP{ID: uint16(si*len(Regions) + ri + 1), Name: r.Spec.POPCode + "-" + spec.Name, Region: ri, Delay: w.Config.Far}
			if ri == spec.Near {
				p.Delay = w.Config.Near
			}
			a := addr(r.Spec.Net, byte(hostRelayBase+si))
			p.Relay = s.start("globalrelay-"+p.Name, "globalrelay", fmt.Sprintf(
				"region: %s\npop: %d\nclusters: [1, 2]\npublic_addr: %q\ninternal_addr: %q\ntcp_addr: %q\nworkers: 1\ndrain_timeout: 1s\n%s",
				r.Spec.Name, p.ID, a, a.Addr(), a, gossip("gossip", "gr-"+p.Name, a.Addr(), seed)))
			site.POPs = append(site.POPs, p)
		}
	}
	for si, site := range w.Sites {
		for ri, p := range site.POPs {
			up := p.Relay.WaitLog(t, "global relay up", startLimit)
			pub, err := netip.ParseAddrPort(up["public"])
			if err != nil {
				t.Fatalf("sim: %s public address: %v", p.Name, err)
			}
			vip := addr(site.Spec.Net, byte(hostSitePOPBase+ri))
			p.Link = s.udpLink(vip, pub, p.Delay, int64(si*10+ri))
			p.TCPLink = s.tcpLink(vip, up["tcp"], p.Delay, netsim.NewTCPLinkWithHandshake)
		}
	}
}

// startSignaling starts the signaling fronts, one per region, with the
// catalogue of the site it serves; the other region's session API is Far
// away.
func (s *starter) startSignaling(seed string) {
	t, w := s.t, s.w
	for ri, r := range w.Regions {
		other := w.Regions[(ri+1)%len(w.Regions)]
		r.RemoteAPI = s.tcpLink(addr(r.Spec.Net, hostRemoteAPI), strings.TrimPrefix(other.SessionAPI, "http://"), w.Config.Far, netsim.NewTCPLink)
	}
	for si, site := range w.Sites {
		r := w.Regions[site.Spec.Near]
		cat := s.write("catalogue-"+site.Spec.Name+".yaml", w.catalogue(site, site.Spec.Near))
		a := addr(r.Spec.Net, byte(hostSignaling+si))
		site.Front = s.start("signaling-"+site.Spec.Name, "signaling", fmt.Sprintf(
			"listen_addr: %q\ndrain_delay: 200ms\ncatalogue: %q\ndemo_page: true\nallow_anonymous: true\ncloudflare_ranges: [\"127.0.0.0/8\"]\nrate_per_second: 100\nrate_burst: 100\n%s",
			a, cat, gossip("gossip", "sig-"+site.Spec.Name, a.Addr(), seed)))
		if r.Signaling == nil {
			r.Signaling = site.Front
		}
	}
	for _, site := range w.Sites {
		r := w.Regions[site.Spec.Near]
		site.FrontURL = site.Front.WaitLog(t, "signaling up", startLimit)["url"]
		if r.Signaling == site.Front {
			r.SignalingURL = site.FrontURL
		}
		site.Signaling = s.tcpLink(addr(site.Spec.Net, hostSiteSig), strings.TrimPrefix(site.FrontURL, "http://"), w.Config.Near, netsim.NewTCPLink)
		site.SignalingURL = "http://" + site.Signaling.Addr().String()
		site.HTTPClient = siteClient(site.Spec.Net)
		t.Cleanup(site.HTTPClient.CloseIdleConnections)
	}
}

// catalogue is the region catalogue of the signaling front that serves
// site: every region with its cluster (the front's own directly, the other
// through its RemoteAPI link) and the site's view of its POP.
func (w *World) catalogue(site *Site, front int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "default_region: %s\nregions:\n", w.Regions[0].Spec.Name)
	for ri, r := range w.Regions {
		api := r.SessionAPI
		if ri != front {
			api = "http://" + w.Regions[front].RemoteAPI.Addr().String()
		}
		p := site.POPs[ri]
		fmt.Fprintf(&b, "  - name: %s\n    location: {lat: %.2f, lon: %.2f}\n", r.Spec.Name, r.Spec.Lat, r.Spec.Lon)
		fmt.Fprintf(&b, "    clusters:\n      - {id: %d, name: %s-1, session_api: %q}\n", r.Spec.Cluster, r.Spec.Name, api)
		fmt.Fprintf(&b, "    pops:\n      - {id: %d, name: %s, vip: %q, tcp_port: %d}\n", p.ID, p.Name, p.VIP(), p.TCPAddr().Port())
	}
	return b.String()
}

// gossip renders one memberlist pool's config section.
func gossip(key, name string, bind netip.Addr, join string) string {
	s := fmt.Sprintf("%s:\n  name: %s\n  bind: %q\n  insecure: true\n  fast: true\n", key, name, netip.AddrPortFrom(bind, 0))
	if join != "" {
		s += fmt.Sprintf("  join: [%q]\n", join)
	}
	return s
}

// siteClient is an HTTP client whose connections leave from the site's
// client address, with no proxy.
func siteClient(net byte) *http.Client {
	d := &netDialer{local: addr(net, hostSiteClient).Addr()}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: d.dial}}
}

type netDialer struct{ local netip.Addr }

func (d *netDialer) dial(ctx context.Context, network, address string) (net.Conn, error) {
	nd := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(d.local, 0))}
	return nd.DialContext(ctx, network, address)
}

// awaitConverged waits until the front sees every cluster known and
// healthy and every POP up. Gossip offers no event to wait on from outside,
// so this polls the front's regions API.
func (w *World) awaitConverged(t testing.TB, url string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(convergeLimit)
	var last string
	for {
		ok, state := converged(client, url)
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("sim: signaling %s did not converge within %v: %s", url, convergeLimit, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func converged(client *http.Client, url string) (bool, string) {
	resp, err := client.Get(url + "/v1/regions")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	var body struct {
		Regions []struct {
			Name     string `json:"name"`
			Clusters []struct {
				ID             uint16 `json:"id"`
				Known, Healthy bool
			} `json:"clusters"`
			POPs []struct {
				Name string `json:"name"`
				Up   bool   `json:"up"`
			} `json:"pops"`
		} `json:"regions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return false, err.Error()
	}
	for _, rg := range body.Regions {
		for _, c := range rg.Clusters {
			if !c.Known || !c.Healthy {
				return false, fmt.Sprintf("cluster %d known=%v healthy=%v", c.ID, c.Known, c.Healthy)
			}
		}
		for _, p := range rg.POPs {
			if !p.Up {
				return false, fmt.Sprintf("POP %s down", p.Name)
			}
		}
	}
	return len(body.Regions) == len(Regions), fmt.Sprintf("%d regions", len(body.Regions))
}

// starter holds what Start needs while it builds the world.
type starter struct {
	t     testing.TB
	w     *World
	dir   string
	auth  *authority.Secrets
	env   []string
	procs []*proctest.Proc
	links []func() // stop functions, in start order
	// redisURL is the phone calls' route cache (Config.SIP), else "".
	redisURL string
}

func (s *starter) write(name, content string) string {
	return proctest.WriteFile(s.t, s.dir, name, content)
}

func (s *starter) start(name, role, config string) *proctest.Proc {
	s.t.Helper()
	p := proctest.Start(s.t, s.w.Config.Binary, proctest.Spec{
		Name: name, Args: []string{role, "-config", s.write(name+".yaml", config)}, Env: s.env})
	s.procs = append(s.procs, p)
	return p
}

// run runs a link until the world stops.
func (s *starter) run(name string, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			s.w.Config.Logger.Error("link stopped", "link", name, "err", err)
		}
	}()
	s.links = append(s.links, func() { cancel(); <-done })
}

func (s *starter) stopLinks() {
	for _, stop := range s.links {
		stop()
	}
}

func (s *starter) linkConfig(delay time.Duration, seed int64) netsim.LinkConfig {
	return netsim.LinkConfig{Delay: delay, Jitter: s.w.Config.Jitter, Seed: s.w.Config.Seed + seed}
}

func (s *starter) udpLink(listen, target netip.AddrPort, delay time.Duration, seed int64) *netsim.UDPLink {
	s.t.Helper()
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(listen))
	if err != nil {
		s.t.Fatalf("sim: listen %v: %v", listen, err)
	}
	l, err := netsim.NewUDPLink(conn, target, s.linkConfig(delay, 2*seed), s.linkConfig(delay, 2*seed+1), s.w.Config.Logger)
	if err != nil {
		conn.Close()
		s.t.Fatalf("sim: link to %v: %v", target, err)
	}
	s.run("udp "+l.Addr().String(), l.Run)
	return l
}

// tcpLink starts a TCP link made by newLink (netsim.NewTCPLink, or
// NewTCPLinkWithHandshake for a client that connects per call).
func (s *starter) tcpLink(listen netip.AddrPort, target string, delay time.Duration,
	newLink func(net.Listener, string, netsim.LinkConfig, netsim.LinkConfig, *slog.Logger) (*netsim.TCPLink, error)) *netsim.TCPLink {
	s.t.Helper()
	ln, err := net.Listen("tcp", listen.String())
	if err != nil {
		s.t.Fatalf("sim: listen %v: %v", listen, err)
	}
	l, err := newLink(ln, target, s.linkConfig(delay, 100), s.linkConfig(delay, 101), s.w.Config.Logger)
	if err != nil {
		ln.Close()
		s.t.Fatalf("sim: link to %s: %v", target, err)
	}
	s.run("tcp "+l.Addr().String(), l.Run)
	return l
}

func quietLogger() *slog.Logger { return testlog.Logger() }
