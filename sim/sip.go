// Phone calls in the simulation (docs/sip.md): with Config.SIP each client
// site also has a carrier. Its trunk points at a SIP front in the site's
// near region (the front's own process, over a TCP link with the site's
// delay), and the front pins the trunk's calls to a POP of that region
// that the carrier reaches directly: a carrier sends RTP from the address
// its SDP names (symmetric RTP, no latching), so its media cannot cross a
// link that translates addresses, as the sites' UDP links do. The carrier
// charges the site's delay itself, both ways (delayConn). The pods write
// each call's route entry to a real Redis that the carrier POPs' global
// relays read, as in production (docs/wire.md §6).

package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/testredis"
	"github.com/rtcedge/rtcedge/netsim"
)

// SIPSite is a site's carrier: its trunk's SIP front and the POP its media
// goes to.
type SIPSite struct {
	// Front is the SIP front of the carrier's trunk, in the site's near
	// region; Link carries the carrier's SIP over TCP to it with the
	// site's delay each way, on the same port as the front (so the
	// Contact of its answers, contact_host plus its port, names the link).
	Front *proctest.Proc
	Link  *netsim.TCPLink
	// FrontAddr is the front's own SIP address (no delay).
	FrontAddr netip.AddrPort
	// URI is what the carrier calls: sip:agent@<link>;transport=tcp.
	URI string
	// POP is the carrier's view of its near region's POP: a global relay
	// of its own (with the route cache) that the carrier sends to
	// directly; its VIP is the relay's public address. Its Link and
	// TCPLink are nil.
	POP *POP
	// Trunk is the trunk's name; Carrier the address the carrier's SIP
	// and RTP leave from.
	Trunk   string
	Carrier netip.Addr
}

// Host numbers for phone calls (see the others' in sim.go).
const (
	hostSIPFrontBase = 20  // + site index, in the near region's network: that site's SIP front
	hostSIPRelayBase = 30  // + site index, in the near region's network: that site's carrier POP
	hostSiteSIP      = 5   // in the site's network: the link to its SIP front
	hostSiteCarrier  = 101 // in the site's network: the carrier's SIP and RTP
)

// startSIP starts each site's carrier POP (a global relay reading the
// route cache, s.redisURL, where the pods write) and SIP front; a site
// whose GeoIP lies gets none (a trunk is pinned to a POP: geography
// does not place its calls).
func (s *starter) startSIP(seed string) {
	t, w := s.t, s.w
	for si, site := range w.Sites {
		if site.Spec.GeoWrong {
			continue
		}
		r := w.Regions[site.Spec.Near]
		p := &POP{ID: uint16(len(w.Sites)*len(w.Regions) + si + 1), Name: r.Spec.POPCode + "-sip-" + site.Spec.Name, Region: site.Spec.Near, Delay: w.Config.Near}
		a := addr(r.Spec.Net, byte(hostSIPRelayBase+si))
		p.Relay = s.start("globalrelay-"+p.Name, "globalrelay", fmt.Sprintf(
			"region: %s\npop: %d\nclusters: [1, 2]\npublic_addr: %q\ninternal_addr: %q\nworkers: 1\ndrain_timeout: 1s\nredis_url: %q\n%s",
			r.Spec.Name, p.ID, a, a.Addr(), s.redisURL, gossip("gossip", "gr-"+p.Name, a.Addr(), seed)))
		site.SIP = &SIPSite{POP: p, Trunk: "carrier-" + site.Spec.Name, Carrier: addr(site.Spec.Net, hostSiteCarrier).Addr()}
	}
	for si, site := range w.Sites {
		if site.SIP == nil {
			continue
		}
		p := site.SIP.POP
		up := p.Relay.WaitLog(t, "global relay up", startLimit)
		pub, err := netip.ParseAddrPort(up["public"])
		if err != nil {
			t.Fatalf("sim: %s public address: %v", p.Name, err)
		}
		p.direct = pub
		r := w.Regions[site.Spec.Near]
		// The link first, on a free port; the front then listens on the
		// same port of its own address.
		ln, err := net.Listen("tcp", addr(site.Spec.Net, hostSiteSIP).String())
		if err != nil {
			t.Fatalf("sim: listen for %s's SIP link: %v", site.Spec.Name, err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		front := netip.AddrPortFrom(addr(r.Spec.Net, byte(hostSIPFrontBase+si)).Addr(), uint16(port))
		cat := s.write("sip-catalogue-"+site.Spec.Name+".yaml", w.sipCatalogue(site))
		site.SIP.Front = s.start("sipfront-"+site.Spec.Name, "sipfront", fmt.Sprintf(
			"sip_tcp: %q\ncontact_host: %q\ncatalogue: %q\nmetrics_addr: %q\ndrain_timeout: 1s\nsource_rate: 1000\nsource_burst: 1000\n"+
				"trunks:\n  - name: %s\n    source_cidrs: [127.0.0.0/8]\n    pop: %s\n    max_calls: 1000\n    calls_per_second: 1000\n    call_burst: 1000\n",
			front, addr(site.Spec.Net, hostSiteSIP).Addr(), cat, netip.AddrPortFrom(front.Addr(), 0), site.SIP.Trunk, p.Name))
		l, err := netsim.NewTCPLink(ln, front.String(), s.linkConfig(w.Config.Near, 200), s.linkConfig(w.Config.Near, 201), w.Config.Logger)
		if err != nil {
			ln.Close()
			t.Fatalf("sim: SIP link: %v", err)
		}
		s.run("tcp "+l.Addr().String(), l.Run)
		site.SIP.Link, site.SIP.FrontAddr = l, front
		site.SIP.URI = fmt.Sprintf("sip:agent@%s;transport=tcp", l.Addr())
	}
	for _, site := range w.Sites {
		if site.SIP != nil {
			awaitListening(t, site.SIP.Front, site.SIP.FrontAddr)
		}
	}
}

// awaitListening waits until the front accepts a TCP connection at a: it
// logs no line of its own once it serves, and a refused connect is how a
// client sees that it does not yet.
func awaitListening(t testing.TB, p *proctest.Proc, a netip.AddrPort) {
	t.Helper()
	proctest.Await(t, startLimit, p.Name()+" accepting SIP on "+a.String(), func() bool {
		c, err := net.DialTimeout("tcp", a.String(), time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// sipCatalogue is the catalogue of site's SIP front: the site's signaling
// catalogue with its near region's POP replaced by the carrier POP (the
// other region's is the site's view, the same ID and VIP as signaling's,
// so a pod binds every POP ID to one VIP), and the near region as the
// default: the front has no GeoIP entry for loopback carriers, and locates
// them where it stands, as a POP's front does with a carrier it cannot
// place.
func (w *World) sipCatalogue(site *Site) string {
	view := site.POPs[site.Spec.Near]
	p := site.SIP.POP
	old := fmt.Sprintf("{id: %d, name: %s, vip: %q, tcp_port: %d}", view.ID, view.Name, view.VIP(), view.TCPAddr().Port())
	cat := w.catalogue(site, site.Spec.Near)
	if !strings.Contains(cat, old) {
		panic("sim: the catalogue does not list " + view.Name + " as expected")
	}
	cat = strings.Replace(cat, "default_region: "+w.Regions[0].Spec.Name+"\n", "default_region: "+w.Regions[site.Spec.Near].Spec.Name+"\n", 1)
	return strings.Replace(cat, old, fmt.Sprintf("{id: %d, name: %s, vip: %q}", p.ID, p.Name, p.VIP()), 1)
}

// startRedis starts the route cache the pods write phone calls' routes to.
func startRedis(t testing.TB) string {
	return "redis://" + testredis.Start(t).Addr() + "/0"
}

// PhoneRoute looks up the route entry a pod wrote for a carrier's media
// address (docs/wire.md §6), as the carrier POPs' global relays do: it
// names the cluster and pod the call was placed on. ok is false on a miss.
// The route cache is best effort (a lookup may be dropped, or time out on
// a loaded machine, and is not retried), so each lookup is retried
// every routeRetry for up to routeLimit.
func (w *World) PhoneRoute(ctx context.Context, media netip.AddrPort) (r routecache.Route, ok bool, err error) {
	const routeRetry, routeLimit = 500 * time.Millisecond, 10 * time.Second
	if w.redisURL == "" {
		return r, false, errors.New("sim: no route cache (Config.SIP is off)")
	}
	c, err := routecache.Open(w.redisURL, routecache.Config{Timeout: routeRetry})
	if err != nil {
		return r, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, routeLimit)
	defer cancel()
	ran := make(chan struct{})
	go func() { defer close(ran); _ = c.Run(ctx) }()
	defer func() { cancel(); <-ran; _ = c.Close() }()
	got := make(chan routecache.Route, 1)
	tick := time.NewTicker(routeRetry)
	defer tick.Stop()
	for {
		c.Lookup(media, func(r routecache.Route) {
			select {
			case got <- r:
			default:
			}
		})
		select {
		case r = <-got:
			if r.Cluster != 0 {
				return r, true, nil
			}
		case <-ctx.Done():
			return r, false, fmt.Errorf("route entry of %v: %w", media, ctx.Err())
		case <-tick.C:
			continue // no answer: ask again
		}
		select { // a miss: ask again at the next tick
		case <-ctx.Done():
			return r, false, fmt.Errorf("route entry of %v: %w", media, ctx.Err())
		case <-tick.C:
		}
	}
}
