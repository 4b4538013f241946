package globalrelay

// Tests of what a spoofing or on-path attacker can do to live flows:
// nothing moves a live flow, quiet ones are taken over only as designed.

import (
	"bytes"
	"context"
	"net/netip"

	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
)

// unit is a relay driven by direct calls (no sockets in the path) on a
// clock the test sets, with two clusters: 0x12 (relay 127.0.0.1:9) and
// 0x13 (relay 127.0.0.1:10).
type unit struct {
	r       *Relay
	reg     *prometheus.Registry
	hop     *encap.ClusterKeys
	buf     []byte
	ingress netip.AddrPort
	t0      time.Time
	offset  time.Duration // the clock: t0 + offset
}

var (
	relay12 = netip.MustParseAddrPort("127.0.0.1:9")
	relay13 = netip.MustParseAddrPort("127.0.0.1:10")
)

func newUnit(t *testing.T, cfg Config) *unit {
	t.Helper()
	k13, err := encap.NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{0x13}, encap.KeyLen)})
	if err != nil {
		t.Fatal(err)
	}
	u := &unit{reg: prometheus.NewRegistry(), buf: make([]byte, encap.MaxLen+encap.MaxPayload),
		hop: encap.NewClusterKeys(map[uint16]*encap.Keyring{0x12: testHop.For(0x12), 0x13: k13}),
		t0:  time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	cfg.POP, cfg.Keys, cfg.Logger, cfg.Registerer = 9, testKeys(t), quiet, u.reg
	cfg.Hop = u.hop
	cfg.Directory = NewClusters([]Replica{{Cluster: 0x12, Addr: relay12}, {Cluster: 0x13, Addr: relay13}})
	cfg.Now = func() time.Time { return u.t0.Add(u.offset) }
	pub, in := listen(t), listen(t)
	if u.r, err = New(cfg, []Worker{{Public: pub, Internal: in}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.r.Close() })
	u.ingress = addrOf(in)
	return u
}

// stamp is the relay's clock in unix seconds, as cache entries carry it.
func (u *unit) stamp() uint32 { return uint32(u.t0.Add(u.offset).Unix()) }

// at sets the relay's clock to t0 + d.
func (u *unit) at(d time.Duration) {
	u.offset = d
	u.r.now.Store(u.t0.Add(d).UnixNano())
	u.r.judgeProbes(u.t0.Add(d).UnixNano()) // what Run's clock tick does
}

// check returns a Binding Request with a token for (cluster, pod) minted at
// t0 + age.
func (u *unit) check(t *testing.T, cluster, pod uint16, mintedAt time.Duration) []byte {
	t.Helper()
	ufrag, err := u.r.cfg.Keys.MintAt(cluster, pod, u.t0.Add(mintedAt))
	if err != nil {
		t.Fatal(err)
	}
	return bindingRequest(t, ufrag)
}

// send hands a client datagram to the relay and returns the header it
// forwarded with, if it forwarded it.
func (u *unit) send(t *testing.T, from netip.AddrPort, pkt []byte) (encap.Header, bool) {
	t.Helper()
	copy(u.buf[encap.MaxLen:], pkt)
	out, to, ok := u.r.fromClient(u.buf, len(pkt), from, u.ingress)
	if !ok {
		return encap.Header{}, false
	}
	h, hl, err := encap.Decode(out)
	if err != nil || u.hop.For(h.Cluster).Verify(out, hl) != nil || !bytes.Equal(out[hl:], pkt) {
		t.Fatalf("forwarded datagram is not a sealed header + the packet: %v", err)
	}
	if want := map[uint16]netip.AddrPort{0x12: relay12, 0x13: relay13}[h.Cluster]; to != want {
		t.Fatalf("forwarded to %v, want cluster %#x's relay %v", to, h.Cluster, want)
	}
	return h, true
}

// reply hands a to-client datagram, sealed with key (nil: the header's
// cluster key), to the relay as if from the cluster's relay.
func (u *unit) reply(t *testing.T, h encap.Header, key *encap.Keyring) bool {
	t.Helper()
	h.ToClient = true
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	hl := len(b)
	b = append(b, 0x80, 1, 2, 3)
	if key == nil {
		key = u.hop.For(h.Cluster)
	}
	key.Seal(b, hl)
	from := map[uint16]netip.AddrPort{0x12: relay12, 0x13: relay13}[h.Cluster]
	_, _, ok := u.r.toClient(b, len(b), from)
	return ok
}

func (u *unit) drops(t *testing.T, reason string) float64 {
	return counter(t, u.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", reason)
}

var media = []byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 9, 9, 9, 9}

// TestSpoofedCheckCannotMoveLiveFlow: a host that knows a caller's address
// and holds another session's valid ufrag (for another cluster) sends 100
// spoofed checks a second from that address. The caller's flow keeps its
// cluster and pod and every one of its packets is forwarded — whether the
// caller talks (a packet every 20 ms) or sits in Opus DTX silence (a packet
// every 400 ms and a consent check every 5 s). Before quiet-time takeover,
// the first spoofed check moved the flow.
func TestSpoofedCheckCannotMoveLiveFlow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{{"talker", 20 * time.Millisecond}, {"DTX silence", 400 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t, Config{})
			victim := netip.MustParseAddrPort("198.51.100.7:50000")
			consent := u.check(t, 0x12, 1, 0)
			u.at(0)
			if h, ok := u.send(t, victim, consent); !ok || h.Pod != 1 {
				t.Fatal("the victim's first check was not forwarded to its pod")
			}
			hijack := u.check(t, 0x13, 5, 0)
			lost := 0
			const run = 20 * time.Second
			nextVictim, nextConsent := tc.every, 5*time.Second
			for now := 10 * time.Millisecond; now < run; now += 10 * time.Millisecond {
				u.at(now)
				if _, ok := u.send(t, victim, hijack); ok {
					t.Fatalf("at %v the spoofed check was forwarded", now)
				}
				if now >= nextConsent {
					nextConsent += 5 * time.Second
					if h, ok := u.send(t, victim, consent); !ok || h.Cluster != 0x12 || h.Pod != 1 {
						lost++
					}
				}
				if now >= nextVictim {
					nextVictim += tc.every
					if h, ok := u.send(t, victim, media); !ok || h.Cluster != 0x12 || h.Pod != 1 {
						lost++
					}
				}
			}
			if lost != 0 {
				t.Errorf("%d of the victim's packets did not reach its pod", lost)
			}
			if f := u.r.flows.get(victim); f == nil || f.cluster != 0x12 || f.pod != 1 {
				t.Fatalf("the victim's flow moved: %+v", f)
			}
			if v := u.drops(t, dropLabels[dropFlowBusy]); v < 1900 {
				t.Errorf("flow_busy drops = %v, want every spoofed check (about 2000)", v)
			}
		})
	}
}

// TestQuietFlowTakeover: a client address whose flow has gone quiet for
// FlowQuiet may be taken over by a check for another pod (a new call from
// a reused port), at most once per FlowQuiet.
func TestQuietFlowTakeover(t *testing.T) {
	u := newUnit(t, Config{FlowQuiet: 3 * time.Second})
	addr := netip.MustParseAddrPort("198.51.100.8:40000")
	u.at(0)
	if _, ok := u.send(t, addr, u.check(t, 0x12, 1, 0)); !ok {
		t.Fatal("first check not forwarded")
	}
	u.at(3 * time.Second)
	if h, ok := u.send(t, addr, u.check(t, 0x13, 2, 0)); !ok || h.Cluster != 0x13 || h.Pod != 2 {
		t.Fatal("a check after FlowQuiet of silence did not take the address over")
	}
	u.at(3*time.Second + 10*time.Millisecond)
	u.at(3*time.Second + 100*time.Millisecond)
	if _, ok := u.send(t, addr, u.check(t, 0x12, 3, 0)); ok {
		t.Fatal("a second takeover within FlowQuiet was allowed")
	}
	if v := counter(t, u.reg, "rtcedge_globalrelay_flow_takeovers_total", "", ""); v != 1 {
		t.Errorf("takeovers = %v, want 1", v)
	}
}

// TestRebindingRestartAndRecovery: what must keep working beside the
// hijack protection. NAT rebinding (the call's token from a new address)
// opens a flow at once, even while the old address is live; an ICE restart
// on the same pod (a new token for the same pod) is forwarded with no wait;
// a restarted relay (empty table) takes the next check and learns flows
// back from replies.
func TestRebindingRestartAndRecovery(t *testing.T) {
	u := newUnit(t, Config{})
	old, rebound := netip.MustParseAddrPort("198.51.100.9:40000"), netip.MustParseAddrPort("198.51.100.9:40001")
	tok := u.check(t, 0x12, 1, 0)
	u.at(0)
	u.send(t, old, tok)
	u.at(20 * time.Millisecond)
	if _, ok := u.send(t, old, media); !ok {
		t.Fatal("media not forwarded")
	}
	if h, ok := u.send(t, rebound, tok); !ok || h.Pod != 1 {
		t.Fatal("NAT rebinding: the call's check from the new address was not forwarded")
	}
	if h, ok := u.send(t, old, u.check(t, 0x12, 1, 0)); !ok || h.Pod != 1 {
		t.Fatal("ICE restart on the same pod: the new token's check was not forwarded")
	}
	// A restarted replica: nothing in its table.
	fresh := newUnit(t, Config{})
	fresh.at(0)
	if _, ok := fresh.send(t, old, media); ok {
		t.Fatal("a restarted replica forwarded media of a flow it does not know")
	}
	// The reply restores the flow but reaches the client only once the
	// client has sent on it (a compromised pod can name any client).
	reply := encap.Header{Cluster: 0x12, Pod: 1, POP: 9, Client: rebound, Ingress: fresh.ingress}
	if fresh.reply(t, reply, nil) {
		t.Fatal("a reply restoring a flow was forwarded before the client sent on it")
	}
	if h, ok := fresh.send(t, rebound, media); !ok || h.Pod != 1 {
		t.Fatal("media of the flow restored from a reply not forwarded")
	}
	if !fresh.reply(t, reply, nil) {
		t.Fatal("a reply of the restored flow not forwarded once the client spoke")
	}
	if h, ok := fresh.send(t, old, tok); !ok || h.Pod != 1 {
		t.Fatal("a restarted replica did not take the next check")
	}
}

// TestTokenCapCountsRestoredFlows: flows restored from the route cache or
// from the return path count against their token's cap. Before, they
// carried no token: after idle/revive rounds one token held 8 flows it
// opened plus every revived one.
func TestTokenCapCountsRestoredFlows(t *testing.T) {
	u := newUnit(t, Config{FlowIdle: time.Minute})
	tok := u.check(t, 0x12, 1, 0)
	addr := func(round, i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(round)}), uint16(20000+i))
	}
	var nonce [6]byte
	u.at(0)
	for i := range maxFlowsPerToken {
		h, ok := u.send(t, addr(1, i), tok)
		if !ok {
			t.Fatalf("flow %d of the token refused", i)
		}
		nonce = h.Token
	}
	// Round 1 idles out here, but the cache and the pod still know it.
	u.at(2 * time.Minute)
	u.r.expire()
	if n := u.r.Flows(); n != 0 {
		t.Fatalf("%d flows after expiry", n)
	}
	for i := range maxFlowsPerToken {
		if _, ok := u.send(t, addr(2, i), tok); !ok {
			t.Fatalf("round 2 flow %d refused", i)
		}
	}
	// Revive round 1 through the cache (entries as a replica sealed them)
	// and through the return path: the token has its 8 flows already.
	for i := range maxFlowsPerToken {
		rt := routecache.Route{Cluster: 0x12, Pod: 1, Token: nonce, Stored: u.stamp()}
		rt.KeyID, rt.Tag = u.hop.For(0x12).SealRoute(addr(1, i), 0x12, 1, nonce, rt.Stored)
		u.r.RestoreFlow(addr(1, i), rt)
		u.reply(t, encap.Header{Cluster: 0x12, Pod: 1, POP: 9, Token: nonce, Client: addr(3, i), Ingress: u.ingress}, nil)
	}
	if n := u.r.Flows(); n != maxFlowsPerToken {
		t.Fatalf("one token holds %d flows after reviving through cache and return path, want %d", n, maxFlowsPerToken)
	}
}

// TestExpiredTokenOpensNoFlow: a token older than TokenLifetime opens no
// new flow, while the flow it opened when young goes on (consent checks
// with the same token still pass).
func TestExpiredTokenOpensNoFlow(t *testing.T) {
	u := newUnit(t, Config{TokenLifetime: 24 * time.Hour})
	caller, stranger := netip.MustParseAddrPort("198.51.100.10:1000"), netip.MustParseAddrPort("198.51.100.11:1000")
	tok := u.check(t, 0x12, 1, 0)
	u.at(0)
	if _, ok := u.send(t, caller, tok); !ok {
		t.Fatal("a fresh token opened no flow")
	}
	for at := time.Hour; at <= 26*time.Hour; at += time.Hour {
		u.at(at)
		if _, ok := u.send(t, caller, tok); !ok {
			t.Fatalf("at %v the existing flow's consent check was dropped", at)
		}
	}
	if _, ok := u.send(t, stranger, tok); ok {
		t.Fatal("a 26-hour-old token opened a new flow")
	}
	if v := u.drops(t, dropLabels[dropTokenExpired]); v != 1 {
		t.Errorf("token_expired drops = %v, want 1", v)
	}
	u.at(20 * time.Hour)
	if _, ok := u.send(t, stranger, tok); !ok {
		t.Fatal("a 20-hour-old token was refused")
	}
}

// TestBadSourcesOpenNoFlow: flows are never created for addresses no client
// can have, by a check, a reply or a cache entry.
func TestBadSourcesOpenNoFlow(t *testing.T) {
	u := newUnit(t, Config{})
	u.at(0)
	pub := udpAddr(u.r.PublicAddr())
	for _, bad := range []netip.AddrPort{
		netip.MustParseAddrPort("198.51.100.1:0"),
		netip.MustParseAddrPort("224.0.0.1:5000"),
		netip.MustParseAddrPort("255.255.255.255:5000"),
		netip.MustParseAddrPort("0.0.0.0:5000"),
		netip.MustParseAddrPort("169.254.1.1:5000"),
		netip.MustParseAddrPort("[ff02::1]:5000"),
		netip.MustParseAddrPort("[fe80::1]:5000"),
		pub, u.ingress,
	} {
		if _, ok := u.send(t, bad, u.check(t, 0x12, 1, 0)); ok {
			t.Errorf("%v: check opened a flow", bad)
		}
		if u.reply(t, encap.Header{Cluster: 0x12, Pod: 1, POP: 9, Client: bad, Ingress: u.ingress}, nil) {
			t.Errorf("%v: reply restored a flow", bad)
		}
		rt := routecache.Route{Cluster: 0x12, Pod: 1, Stored: u.stamp()}
		rt.KeyID, rt.Tag = u.hop.For(0x12).SealRoute(bad, 0x12, 1, rt.Token, rt.Stored)
		u.r.RestoreFlow(bad, rt)
	}
	if n := u.r.Flows(); n != 0 {
		t.Fatalf("%d flows for impossible sources", n)
	}
	// Loopback is a client address only when the relay itself is on
	// loopback (dev world, tests); in production it is refused.
	onLoopback := defaultAllowSource(netip.MustParseAddr("127.0.0.1"))
	public := defaultAllowSource(netip.MustParseAddr("203.0.113.1"))
	unspecified := defaultAllowSource(netip.IPv4Unspecified())
	for _, tc := range []struct {
		addr                   string
		loop, pub, unspecified bool
	}{
		{"127.0.0.1", true, false, false}, {"::1", true, false, false},
		{"198.51.100.7", true, true, true}, {"10.1.2.3", true, true, true}, {"2001:db8::7", true, true, true},
		{"224.0.0.1", false, false, false}, {"fe80::1", false, false, false},
	} {
		a := netip.MustParseAddr(tc.addr)
		if onLoopback(a) != tc.loop || public(a) != tc.pub || unspecified(a) != tc.unspecified {
			t.Errorf("%s: allowed on loopback/public/unspecified relay = %v/%v/%v, want %v/%v/%v", a,
				onLoopback(a), public(a), unspecified(a), tc.loop, tc.pub, tc.unspecified)
		}
	}
}

func udpAddr(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// TestForgedDatagramsChangeNoState: a reply whose MAC does not verify (no
// key, another cluster's key, a retired key ID, an altered header) and a
// route-cache entry that does not verify are dropped and counted, and
// change nothing else: no flow, no metric but the drop.
func TestForgedDatagramsChangeNoState(t *testing.T) {
	u := newUnit(t, Config{})
	u.at(0)
	victim := netip.MustParseAddrPort("198.51.100.12:3000")
	h := encap.Header{Cluster: 0x12, Pod: 1, POP: 9, Client: victim, Ingress: u.ingress}
	wrongKey, _ := encap.NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{0x66}, encap.KeyLen)})
	retired, _ := encap.NewKeyring(7, map[uint8][]byte{7: bytes.Repeat([]byte{0x12}, encap.KeyLen)})
	for _, tc := range []struct {
		name   string
		key    *encap.Keyring
		reason string
	}{
		{"another cluster's key", u.hop.For(0x13), "encap_mac"},
		{"a key nobody holds", wrongKey, "encap_mac"},
		{"a key ID not held", retired, "encap_unknown_key"},
	} {
		before := testmetrics.Take(t, u.reg)
		if u.reply(t, h, tc.key) {
			t.Fatalf("%s: forged reply forwarded", tc.name)
		}
		testmetrics.OnlyIncremented(t, before, testmetrics.Take(t, u.reg), "rtcedge_globalrelay_dropped_packets_total,reason="+tc.reason)
	}
	// A cache entry someone wrote into Redis without the key, or an
	// entry for the victim altered to point at another pod.
	sealRoute := func(pod uint16, stored uint32) routecache.Route {
		rt := routecache.Route{Cluster: 0x12, Pod: pod, Stored: stored}
		rt.KeyID, rt.Tag = u.hop.For(0x12).SealRoute(victim, 0x12, pod, rt.Token, stored)
		return rt
	}
	good := sealRoute(1, u.stamp())
	altered := good
	altered.Pod = 2
	// An entry sealed (genuinely) for the victim's address long ago, by a
	// call since ended on another pod: replayed, it must not win.
	old := sealRoute(2, u.stamp()-3600)
	for _, rt := range []routecache.Route{{Cluster: 0x12, Pod: 2, KeyID: 1, Tag: 12345}, altered, {Cluster: 0x14, Pod: 1}, old} {
		u.r.RestoreFlow(victim, rt)
	}
	if n := u.r.Flows(); n != 0 {
		t.Fatalf("%d flows from forged or replayed cache entries", n)
	}
	if v := counter(t, u.reg, "rtcedge_globalrelay_cache_rejected_total", "", ""); v != 4 {
		t.Errorf("cache_rejected = %v, want 4", v)
	}
	u.r.RestoreFlow(victim, good)
	if f := u.r.flows.get(victim); f == nil || f.pod != 1 {
		t.Fatal("a sealed cache entry was not restored")
	}
}

// TestNoHopKeyOpensNoFlow: a valid token for a cluster this POP holds no
// hop key for is refused before any flow exists (a config error shows as
// no_hop_key, not as a flow that forwards nothing).
func TestNoHopKeyOpensNoFlow(t *testing.T) {
	u := newUnit(t, Config{})
	u.at(0)
	if _, ok := u.send(t, netip.MustParseAddrPort("198.51.100.50:1"), u.check(t, 0x14, 1, 0)); ok {
		t.Fatal("forwarded toward a cluster without a hop key")
	}
	if n := u.r.Flows(); n != 0 {
		t.Fatalf("%d flows", n)
	}
	if v := u.drops(t, dropLabels[dropNoHopKey]); v != 1 {
		t.Errorf("no_hop_key drops = %v, want 1", v)
	}
}

// storeCounter is a route cache that counts the stores it is given.
type storeCounter struct {
	mu     sync.Mutex
	stores int
}

func (c *storeCounter) Store(netip.AddrPort, routecache.Route) {
	c.mu.Lock()
	c.stores++
	c.mu.Unlock()
}
func (c *storeCounter) Lookup(netip.AddrPort, func(routecache.Route)) {}
func (c *storeCounter) Delete(netip.AddrPort)                         {}
func (c *storeCounter) Flush(context.Context) error                   { return nil }
func (c *storeCounter) Stats() routecache.Stats                       { return routecache.Stats{} }
func (c *storeCounter) Run(context.Context) error                     { return nil }
func (c *storeCounter) Close() error                                  { return nil }
func (c *storeCounter) n() int                                        { c.mu.Lock(); defer c.mu.Unlock(); return c.stores }

// TestRestoredFlowRefreshesItsEntry: a flow restored from an entry 50 s
// old rewrites it by the time it would expire (written at 0, TTL 60 s).
// It used to count the restore as a fresh store and wait a whole
// CacheRefresh, leaving a window in which its entry was gone and a second
// move of the client found nothing.
func TestRestoredFlowRefreshesItsEntry(t *testing.T) {
	c := &storeCounter{}
	u := newUnit(t, Config{Cache: c})
	client := netip.MustParseAddrPort("198.51.100.77:4000")
	u.at(0)
	stored := u.stamp()
	rt := routecache.Route{Cluster: 0x12, Pod: 1, Stored: stored}
	rt.KeyID, rt.Tag = u.hop.For(0x12).SealRoute(client, 0x12, 1, rt.Token, stored)
	u.at(50 * time.Second)
	u.r.RestoreFlow(client, rt)
	if u.r.flows.get(client) == nil {
		t.Fatal("not restored")
	}
	u.at(51 * time.Second)
	u.send(t, client, media)
	if c.n() == 0 {
		t.Error("no store after the restore of a 50 s old entry: it expires at 60 s")
	}
}

// TestRestoreJudgesAgeByTheClock: the bulk load of the route cache runs
// before Run advances the coarse clock; a fresh entry must not look "from
// the future" then.
func TestRestoreJudgesAgeByTheClock(t *testing.T) {
	u := newUnit(t, Config{})
	u.at(0)
	u.offset = 6 * time.Second // the clock moved; nothing advanced the coarse one
	client := netip.MustParseAddrPort("198.51.100.78:4000")
	stored := u.stamp() // written just now by another replica
	rt := routecache.Route{Cluster: 0x12, Pod: 1, Stored: stored}
	rt.KeyID, rt.Tag = u.hop.For(0x12).SealRoute(client, 0x12, 1, rt.Token, stored)
	u.r.RestoreFlow(client, rt)
	if u.r.flows.get(client) == nil {
		t.Error("a fresh, correctly sealed entry was rejected before Run")
	}
}

// TestRestoreBudgetAtomic: workers racing across many seconds' turns
// never admit more return-path restores than the budget of the seconds
// they saw. The budget's second and count were two atomics, reset by
// whoever saw the second change: a late reset wiped the count others had
// added to, and the second's budget was spent again.
func TestRestoreBudgetAtomic(t *testing.T) {
	u := newUnit(t, Config{MaxFlows: 8}) // a budget of 1 a second
	const workers, calls = 4, 50000
	u.at(0)
	var admitted, seconds atomic.Int64
	seconds.Store(1)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				if w == 0 && i%4 == 0 { // the clock turns while the others spend
					u.r.now.Store(u.t0.Add(time.Duration(seconds.Add(1)-1) * time.Second).UnixNano())
				}
				if u.r.restoreBudget() {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n, s := admitted.Load(), seconds.Load(); n > s {
		t.Fatalf("%d restores admitted over %d seconds, want at most the budget of 1 a second", n, s)
	}
}
