package globalrelay

// Tests of the data-plane failover (failover.go, suspects.go,
// relayprobe.go): silent and unanswering relays left, suspicion only on
// several sessions' evidence confirmed by the relay's silence and its
// probe, back-off, healthy flows kept.

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// relay12b is a second cluster relay of cluster 0x12 in the failover tests.
var relay12b = netip.MustParseAddrPort("127.0.0.1:11")

// failoverUnit is a unit whose cluster 0x12 has two relays, with a client
// whose flow rendezvous-hashes to relay12 and one that hashes to relay12b.
type failoverUnit struct {
	*unit
	t       *testing.T
	clients map[netip.AddrPort]netip.AddrPort // preferred relay → a client that prefers it
	hdr     map[netip.AddrPort]encap.Header   // per client: the header of its flow
}

func newFailoverUnit(t *testing.T) *failoverUnit {
	u := newUnit(t, Config{})
	dir := u.r.cfg.Directory.(*Clusters)
	dir.Set([]Replica{{Cluster: 0x12, Addr: relay12}, {Cluster: 0x12, Addr: relay12b}, {Cluster: 0x13, Addr: relay13}})
	f := &failoverUnit{unit: u, t: t, clients: map[netip.AddrPort]netip.AddrPort{}, hdr: map[netip.AddrPort]encap.Header{}}
	for port := uint16(40000); len(f.clients) < 2; port++ {
		c := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
		if r, _ := dir.RelayFor(0x12, c); f.clients[r] == (netip.AddrPort{}) {
			f.clients[r] = c
		}
	}
	return f
}

// forward hands a client datagram to the relay and returns the cluster
// relay it went to.
func (f *failoverUnit) forward(client netip.AddrPort, pkt []byte) netip.AddrPort {
	f.t.Helper()
	copy(f.buf[encap.MaxLen:], pkt)
	out, to, ok := f.r.fromClient(f.buf, len(pkt), client, f.ingress)
	if !ok {
		f.t.Fatalf("datagram from %v not forwarded", client)
	}
	h, _, err := encap.Decode(out)
	if err != nil {
		f.t.Fatal(err)
	}
	f.hdr[client] = h
	return to
}

// answer hands the relay a reply for client's flow from relay.
func (f *failoverUnit) answer(client, relay netip.AddrPort) {
	f.t.Helper()
	h := f.hdr[client]
	h.ToClient = true
	b, err := h.AppendTo(nil)
	if err != nil {
		f.t.Fatal(err)
	}
	hl := len(b)
	b = append(b, 0x80, 1, 2, 3)
	f.hop.For(h.Cluster).Seal(b, hl)
	if _, _, ok := f.r.toClient(b, len(b), relay); !ok {
		f.t.Fatalf("reply from %v for %v dropped", relay, client)
	}
}

// call runs an echo call on client for d from the current clock: media
// every 20 ms, each answered by the relay it went to when that relay is
// alive. It returns the relays used, in order of first use.
func (f *failoverUnit) call(client netip.AddrPort, from, d time.Duration, alive func(netip.AddrPort) bool) []netip.AddrPort {
	f.t.Helper()
	var used []netip.AddrPort
	for at := from; at < from+d; at += 20 * time.Millisecond {
		f.at(at)
		to := f.forward(client, media)
		if len(used) == 0 || used[len(used)-1] != to {
			used = append(used, to)
		}
		if alive(to) {
			f.answer(client, to)
		}
	}
	return used
}

// open starts client's flow at time 0 with a check for pod, answered by
// the relay it went to.
func (f *failoverUnit) open(client netip.AddrPort, pod uint16) {
	f.t.Helper()
	f.at(0)
	f.answer(client, f.forward(client, f.check(f.t, 0x12, pod, 0)))
}

// clientOf returns a client address after after whose flow would hash to
// relay.
func (f *failoverUnit) clientOf(relay, after netip.AddrPort) netip.AddrPort {
	for c := netip.AddrPortFrom(after.Addr(), after.Port()+1); ; c = netip.AddrPortFrom(c.Addr(), c.Port()+1) {
		if r, _ := f.r.cfg.Directory.RelayFor(0x12, c); r == relay {
			return c
		}
	}
}

// leaves sends client's media every 20 ms from from on, for up to 3 s and
// never answered, and returns how long it took until a datagram went to
// another relay than relay (0: never).
func (f *failoverUnit) leaves(client, relay netip.AddrPort, from time.Duration) time.Duration {
	f.t.Helper()
	for at := from; at < from+3*time.Second; at += 20 * time.Millisecond {
		f.at(at)
		if f.forward(client, media) != relay {
			return max(at-from, 1)
		}
	}
	return 0
}

func (f *failoverUnit) repicks(reason string) float64 {
	return counter(f.t, f.reg, "rtcedge_globalrelay_relay_repicks_total", "reason", reason)
}

func (f *failoverUnit) suspects() int { return f.r.suspects.count(f.r.now.Load()) }

func all(netip.AddrPort) bool { return true }

// probeUnanswered is the wait for the probe a vote that stood sent to a
// relay that does not answer (nothing listens at relay12): the relay is
// not suspect before it ends, and the wait is at most CheckTimeout. It
// advances the clock past it.
func (f *failoverUnit) probeUnanswered() {
	f.t.Helper()
	if n := counter(f.t, f.reg, "rtcedge_globalrelay_relay_probes_total", "result", ProbeSent); n < 1 {
		f.t.Fatalf("relay_probes_total{sent} = %v: no probe before the suspicion", n)
	}
	if n := f.suspects(); n != 0 {
		f.t.Fatalf("%d relays suspect before their probe's wait ended", n)
	}
	wait := time.Duration(f.r.probeWait(0x12))
	if wait < probeMinWait || wait > DefaultCheckTimeout {
		f.t.Fatalf("probe wait %v, want %v–%v", wait, probeMinWait, DefaultCheckTimeout)
	}
	f.t.Logf("probe wait %v", wait)
	f.at(f.offset + wait)
	if n := counter(f.t, f.reg, "rtcedge_globalrelay_relay_probes_total", "result", ProbeUnanswered); n < 1 {
		f.t.Errorf("relay_probes_total{unanswered} = %v, want the probe counted", n)
	}
}

// TestSilentClusterRelayIsLeft: a flow whose cluster relay stops answering
// (the client keeps sending) moves to the cluster's other relay within
// SilenceAfter plus a clock tick, without any change in gossip; the other
// flows are not moved by one flow's silence.
func TestSilentClusterRelayIsLeft(t *testing.T) {
	f := newFailoverUnit(t)
	a, other := f.clients[relay12], f.clients[relay12b]
	f.open(a, 7)
	f.open(other, 8)
	if used := f.call(a, 0, time.Second, all); len(used) != 1 || used[0] != relay12 {
		t.Fatalf("healthy call used relays %v, want only %v", used, relay12)
	}
	// relay12 dies: nothing comes back through it, the client goes on.
	moved := f.leaves(a, relay12, time.Second)
	t.Logf("silent relay left after %v of silence", moved)
	if moved == 0 || moved > DefaultSilenceAfter+clockTick {
		t.Fatalf("the flow left its silent relay after %v, want within %v", moved, DefaultSilenceAfter+clockTick)
	}
	if n := f.repicks(RepickSilence); n != 1 {
		t.Errorf("repicks{silence} = %v, want 1", n)
	}
	if n := f.suspects(); n != 0 {
		t.Errorf("one flow's silence made %v relays suspect for everyone, want 0", n)
	}
	if to := f.forward(other, media); to != relay12b {
		t.Errorf("the other flow moved to %v", to)
	}
}

// TestUnansweredCheckMakesRelaySuspect: a check through a relay that gets
// no reply at all moves its flow off that relay; when flows of three
// sessions find the same, every flow avoids the relay (new ones too) until
// it answers again, and a relay that answers is trusted again at once. One
// session's evidence, however strong, moves only its own flow: a caller can
// leave its own checks unanswered at will (a wrong MESSAGE-INTEGRITY), and
// would otherwise turn every call away from a healthy relay.
func TestUnansweredCheckMakesRelaySuspect(t *testing.T) {
	f := newFailoverUnit(t)
	a := f.clients[relay12]
	b := f.clientOf(relay12, netip.AddrPortFrom(a.Addr(), 50000))
	c := f.clientOf(relay12, b)
	// Session a's call also has flows from two more addresses (its own
	// token from other candidates).
	a2 := f.clientOf(relay12, netip.AddrPortFrom(a.Addr(), 55000))
	a3 := f.clientOf(relay12, a2)
	tokA := f.check(t, 0x12, 7, 0)
	for _, cl := range []netip.AddrPort{a, a2, a3} {
		f.at(0)
		f.answer(cl, f.forward(cl, tokA))
	}
	for _, cl := range []netip.AddrPort{a, a2, a3} {
		f.call(cl, 0, 200*time.Millisecond, all)
	}
	// Consent checks through relay12 right after the last replies, never
	// answered; the clients' next datagrams come CheckTimeout later.
	unanswered := func(at time.Duration, cls map[netip.AddrPort]uint16) {
		t.Helper()
		f.at(at)
		for cl, pod := range cls {
			if to := f.forward(cl, f.check(t, 0x12, pod, 0)); to != relay12 {
				t.Fatalf("check went to %v", to)
			}
		}
		f.at(at + DefaultCheckTimeout)
		for cl := range cls {
			if to := f.forward(cl, media); to != relay12b {
				t.Fatalf("%v after an unanswered check the flow still uses %v", DefaultCheckTimeout, to)
			}
		}
	}
	unanswered(220*time.Millisecond, map[netip.AddrPort]uint16{a: 7, a2: 7, a3: 7})
	if n := f.repicks(RepickCheck); n != 3 {
		t.Errorf("repicks{check} = %v, want 3", n)
	}
	if n := f.suspects(); n != 0 {
		t.Errorf("one session's unanswered checks (three flows) made %v relays suspect for everyone, want 0", n)
	}
	fresh := f.clientOf(relay12, c)
	if to := f.forward(fresh, f.check(t, 0x12, 11, 0)); to != relay12 {
		t.Errorf("after one session's evidence a new flow was sent to %v, want its own relay", to)
	}
	// Two more sessions' calls start, and their checks go unanswered too.
	t1 := 240*time.Millisecond + DefaultCheckTimeout
	for i, cl := range []netip.AddrPort{b, c} {
		f.at(t1)
		f.answer(cl, f.forward(cl, f.check(t, 0x12, uint16(8+i), 0)))
		f.call(cl, t1, 200*time.Millisecond, all)
	}
	unanswered(t1+220*time.Millisecond, map[netip.AddrPort]uint16{b: 8, c: 9})
	// A host that can reach the internal socket answers the probe in
	// relay12's name without the key: counted, and no help.
	forged, _ := encap.NewKeyring(1, map[uint8][]byte{1: make([]byte, encap.KeyLen)})
	fake := forged.SealProbe(make([]byte, encap.ProbeLen), 0x12, 1, f.ingress, relay12)
	if err := forged.AnswerProbe(fake, f.ingress, relay12); err != nil {
		t.Fatal(err)
	}
	before := counter(t, f.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "encap_mac")
	f.r.toClient(fake, len(fake), relay12)
	if n := counter(t, f.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "encap_mac"); n != before+1 {
		t.Errorf("a forged probe answer: drops{encap_mac} %v → %v, want +1", before, n)
	}
	f.probeUnanswered()
	if n := f.suspects(); n != 1 {
		t.Errorf("after three sessions' unanswered checks, suspects = %v, want 1", n)
	}
	// A new call whose client hashes to relay12 starts on relay12b.
	next := f.clientOf(relay12, fresh)
	if to := f.forward(next, f.check(t, 0x12, 9, 0)); to != relay12b {
		t.Errorf("a new flow was sent to the suspect relay %v", to)
	}
	// relay12 answers (a late reply): trusted again, new flows go back.
	f.answer(a, relay12)
	if n := f.suspects(); n != 0 {
		t.Errorf("after relay12 answered, suspects = %v, want 0", n)
	}
	late := f.clientOf(relay12, next)
	if to := f.forward(late, f.check(t, 0x12, 10, 0)); to != relay12 {
		t.Errorf("after relay12 answered again a new flow went to %v", to)
	}
}

// TestNoReplyAnywhereBacksOff: when no relay answers (the pod is gone), the
// flow does not flap between relays every SilenceAfter: each re-pick
// doubles the limits.
func TestNoReplyAnywhereBacksOff(t *testing.T) {
	f := newFailoverUnit(t)
	a := f.clients[relay12]
	f.open(a, 7)
	f.call(a, 0, time.Second, all)
	f.call(a, time.Second, 10*time.Second, func(netip.AddrPort) bool { return false })
	n := f.repicks(RepickSilence) + f.repicks(RepickCheck)
	t.Logf("10 s without any reply: %v re-picks", n)
	if n < 1 || n > 6 {
		t.Errorf("%v re-picks in 10 s without replies, want 1–6 (back-off)", n)
	}
}

// TestQuietModelIsNotAFailure: a call whose server side sends only RTCP
// (about once a second) while the client talks is never moved.
func TestQuietModelIsNotAFailure(t *testing.T) {
	f := newFailoverUnit(t)
	a := f.clients[relay12]
	f.open(a, 7)
	next := time.Duration(0)
	for at := time.Duration(0); at < 15*time.Second; at += 20 * time.Millisecond {
		f.at(at)
		if to := f.forward(a, media); to != relay12 {
			t.Fatalf("at %v the quiet call moved to %v", at, to)
		}
		if at >= next {
			f.answer(a, relay12)
			next += time.Second
		}
	}
}

// TestRestoredFlowLeavesDeadRelay: a flow restored from the route cache
// (no reply yet through any relay) whose relay is dead moves to the
// cluster's other relay after a second of client media with nothing back,
// and other flows avoid that relay from then on.
func TestRestoredFlowLeavesDeadRelay(t *testing.T) {
	f := newFailoverUnit(t)
	a := f.clients[relay12]
	f.at(0)
	stored := uint32(f.t0.Unix())
	r := routecache.Route{Cluster: 0x12, Pod: 7, Token: [6]byte{1, 2, 3, 4, 5, 6}, Stored: stored}
	r.KeyID, r.Tag = f.hop.For(0x12).SealRoute(a, 0x12, 7, r.Token, stored)
	f.r.RestoreFlow(a, r)
	moved := time.Duration(0)
	for at := time.Duration(0); at < 3*time.Second && moved == 0; at += 20 * time.Millisecond {
		f.at(at)
		if f.forward(a, media) == relay12b {
			moved = at
		}
	}
	t.Logf("restored flow left its dead relay after %v", moved)
	if moved == 0 || moved > firstCheckTimeout+clockTick {
		t.Errorf("restored flow left its dead relay after %v, want within %v", moved, firstCheckTimeout+clockTick)
	}
	// One session's evidence moves only its flow; restored flows of two
	// more sessions that find the same make it evidence for every flow:
	// another restored flow that would hash to the relay starts on the
	// other one.
	if n := f.suspects(); n != 0 {
		t.Errorf("one restored flow made %v relays suspect for everyone, want 0", n)
	}
	more := []netip.AddrPort{f.clientOf(relay12, netip.AddrPortFrom(a.Addr(), 50000))}
	more = append(more, f.clientOf(relay12, more[0]))
	at := moved + clockTick
	f.at(at)
	for i, c := range more {
		rc := routecache.Route{Cluster: 0x12, Pod: 7, Token: [6]byte{1, 2, 3, 4, 5, byte(7 + i)}, Stored: stored}
		rc.KeyID, rc.Tag = f.hop.For(0x12).SealRoute(c, 0x12, 7, rc.Token, stored)
		f.r.RestoreFlow(c, rc)
		if to := f.forward(c, media); to != relay12 {
			t.Fatalf("restored flow %v went to %v before any evidence", c, to)
		}
	}
	f.at(at + firstCheckTimeout + clockTick)
	for _, c := range more {
		if to := f.forward(c, media); to != relay12b {
			t.Errorf("restored flow %v still on the dead relay", c)
		}
	}
	f.probeUnanswered()
	if n := f.suspects(); n != 1 {
		t.Errorf("after three sessions' restored flows left it, %v relays suspect, want 1", n)
	}
	b := f.clientOf(relay12, more[1])
	r.KeyID, r.Tag = f.hop.For(0x12).SealRoute(b, 0x12, 7, r.Token, stored)
	f.r.RestoreFlow(b, r)
	if to := f.forward(b, media); to != relay12b {
		t.Errorf("a restored flow went to the relay three sessions found dead: %v", to)
	}
}

// relay12c is a third cluster relay of cluster 0x12: a replacement that
// joins gossip while the pods do not know it yet (their relay sets fail
// closed, so it answers nothing).
var relay12c = netip.MustParseAddrPort("127.0.0.1:12")

// clientRanking returns a client address whose rendezvous order over the
// given relays is exactly that order.
func clientRanking(t *testing.T, order ...netip.AddrPort) netip.AddrPort {
	t.Helper()
	for port := uint16(20000); port < 60000; port++ {
		c := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
		ok := true
		for i := 1; i < len(order) && ok; i++ {
			ok = score(c, order[i-1]) > score(c, order[i])
		}
		if ok {
			return c
		}
	}
	t.Fatalf("no client ranks the relays %v in that order", order)
	return netip.AddrPort{}
}

// TestReplacedRelayFlowFindsLiveOne: the cluster relay a flow used dies
// and a replacement joins gossip at once (the soak's "cluster relay
// killed and replaced"), while the dead one stays listed (WAN timings)
// and the pods do not trust the replacement yet. The flow must try the
// cluster's third, live relay after the two silent ones rather than
// alternate between them with its limits doubling (12 s of silence in
// the soak).
func TestReplacedRelayFlowFindsLiveOne(t *testing.T) {
	f := newFailoverUnit(t)
	dir := f.r.cfg.Directory.(*Clusters)
	a := clientRanking(t, relay12, relay12c, relay12b)
	f.open(a, 7)
	if used := f.call(a, 0, time.Second, all); len(used) != 1 || used[0] != relay12 {
		t.Fatalf("healthy call used %v, want %v", used, []netip.AddrPort{relay12})
	}
	dir.Set([]Replica{{Cluster: 0x12, Addr: relay12}, {Cluster: 0x12, Addr: relay12b}, {Cluster: 0x12, Addr: relay12c}, {Cluster: 0x13, Addr: relay13}})
	live := func(r netip.AddrPort) bool { return r == relay12b }
	var reached time.Duration
	var used []netip.AddrPort
	for at := time.Second; at < 11*time.Second; at += 20 * time.Millisecond {
		f.at(at)
		to := f.forward(a, media)
		if len(used) == 0 || used[len(used)-1] != to {
			used = append(used, to)
		}
		if live(to) {
			if reached == 0 {
				reached = at - time.Second
			}
			f.answer(a, to)
		} else if reached != 0 {
			t.Fatalf("at %v the flow left the live relay for %v (relays used: %v)", at, to, used)
		}
	}
	t.Logf("relays used %v; the live one reached after %v of silence", used, reached)
	// Each silent relay is judged after SilenceAfter (and a clock tick).
	if limit := 2*(DefaultSilenceAfter+clockTick) + clockTick; reached == 0 || reached > limit {
		t.Errorf("the flow reached the live relay after %v (relays used: %v), want within %v", reached, used, limit)
	}
}

// TestNewRelayDoesNotMoveHealthyFlow: a relay joining gossip does not take
// a flow that is being answered through its current relay, even if the
// newcomer ranks first for it: the pods may not trust the newcomer yet,
// and a healthy call has nothing to gain from moving. New flows use it.
func TestNewRelayDoesNotMoveHealthyFlow(t *testing.T) {
	f := newFailoverUnit(t)
	dir := f.r.cfg.Directory.(*Clusters)
	a := clientRanking(t, relay12c, relay12b, relay12)
	f.open(a, 7)
	f.call(a, 0, time.Second, all)
	before := f.forward(a, media)
	dir.Set([]Replica{{Cluster: 0x12, Addr: relay12}, {Cluster: 0x12, Addr: relay12b}, {Cluster: 0x12, Addr: relay12c}, {Cluster: 0x13, Addr: relay13}})
	if used := f.call(a, time.Second, 2*time.Second, func(r netip.AddrPort) bool { return r != relay12c }); len(used) != 1 || used[0] != before {
		t.Errorf("after a relay joined, the healthy flow used %v, want only %v", used, before)
	}
	fresh := f.clientOf(relay12c, a)
	f.at(3 * time.Second)
	if to := f.forward(fresh, f.check(t, 0x12, 9, 0)); to != relay12c {
		t.Errorf("a new flow that ranks the new relay first went to %v", to)
	}
	// The flow's current relay leaving gossip still moves it.
	dir.Set([]Replica{{Cluster: 0x12, Addr: relay12c}, {Cluster: 0x13, Addr: relay13}})
	f.at(3 * time.Second)
	if to := f.forward(a, media); to != relay12c {
		t.Errorf("with its relay gone from gossip the flow still went to %v", to)
	}
}

// TestYoungFlowLeavesSilentRelay: a call half a second into its media,
// whose replies during setup (checks, DTLS) came half a second apart,
// still has its relay's silence judged by SilenceAfter, not by the setup's
// spacing: the smoothed reply interval follows media quickly downward.
// (With 1/8 weight for shorter intervals it took 720 ms in the end-to-end
// failover test instead of 300 ms.)
func TestYoungFlowLeavesSilentRelay(t *testing.T) {
	f := newFailoverUnit(t)
	a := f.clients[relay12]
	f.open(a, 7)
	for at := 500 * time.Millisecond; at <= 2*time.Second; at += 500 * time.Millisecond {
		f.at(at)
		f.answer(a, f.forward(a, f.check(t, 0x12, 7, 0)))
	}
	// Half a second of echoed media, every 20 ms, on the relay's coarse
	// clock (replies within one tick count once).
	for at := 2 * time.Second; at < 2500*time.Millisecond; at += 20 * time.Millisecond {
		f.at(at.Truncate(clockTick))
		f.answer(a, f.forward(a, media))
	}
	moved := f.leaves(a, relay12, 2500*time.Millisecond)
	t.Logf("left the silent relay after %v", moved)
	if moved == 0 || moved > DefaultSilenceAfter+clockTick {
		t.Errorf("a young flow left its silent relay after %v, want within %v", moved, DefaultSilenceAfter+clockTick)
	}
}

// TestRestoredFlowsLeaveDeadRelayByClusterRTT: a restarted replica restores
// its flows from the route cache; those through a live relay are answered
// within a round trip, and that round trip, learnt for the cluster, judges
// the flows through a relay that died (and that gossip at WAN timings
// still lists): they leave it after CheckTimeout, not after the blind
// second a flow with nothing to compare waits (the soak's 1.0–1.2 s gaps
// when a replica restarted 10 s after a cluster relay was killed).
func TestRestoredFlowsLeaveDeadRelayByClusterRTT(t *testing.T) {
	f := newFailoverUnit(t)
	dead, live := f.clients[relay12], f.clients[relay12b]
	f.at(0)
	stored := uint32(f.t0.Unix())
	for _, c := range []netip.AddrPort{dead, live} {
		r := routecache.Route{Cluster: 0x12, Pod: 7, Token: [6]byte{1, 2, 3, 4, 5, 6}, Stored: stored}
		r.KeyID, r.Tag = f.hop.For(0x12).SealRoute(c, 0x12, 7, r.Token, stored)
		f.r.RestoreFlow(c, r)
	}
	moved := time.Duration(0)
	for at := time.Duration(0); at < 3*time.Second && moved == 0; at += 20 * time.Millisecond {
		f.at(at.Truncate(clockTick))
		if to := f.forward(live, media); to == relay12b {
			f.answer(live, to)
		}
		if f.forward(dead, media) != relay12 {
			moved = max(at, 1)
		}
	}
	t.Logf("restored flow left its dead relay after %v", moved)
	if limit := DefaultCheckTimeout + 2*clockTick; moved == 0 || moved > limit {
		t.Errorf("restored flow left its dead relay after %v, want within %v (the live relay answered its cluster's other flow at once)", moved, limit)
	}
	// Evidence judged by the cluster's round trips moves the flow only: a
	// pod slow to answer one new call must not turn its relay away from
	// every flow. (A second without a reply still does.)
	if n := f.suspects(); n != 0 {
		t.Errorf("%v relays suspect for everyone after evidence borrowed from the cluster, want 0", n)
	}
	// Two more restored flows (of other sessions) through the dead relay
	// leave it the same way: three sessions at once are no slow pod and no
	// single caller, so every flow avoids it now.
	at := moved.Truncate(clockTick) + clockTick
	more := []netip.AddrPort{f.clientOf(relay12, netip.AddrPortFrom(dead.Addr(), 50000))}
	more = append(more, f.clientOf(relay12, more[0]))
	for i, c := range more {
		r := routecache.Route{Cluster: 0x12, Pod: 7, Token: [6]byte{1, 2, 3, 4, 5, byte(7 + i)}, Stored: stored}
		r.KeyID, r.Tag = f.hop.For(0x12).SealRoute(c, 0x12, 7, r.Token, stored)
		f.r.RestoreFlow(c, r)
	}
	for _, c := range more {
		f.at(at)
		if to := f.forward(c, media); to != relay12 {
			t.Fatalf("restored flow %v went to %v before any evidence", c, to)
		}
	}
	f.at(at + DefaultCheckTimeout)
	for _, c := range more {
		if to := f.forward(c, media); to == relay12 {
			t.Errorf("restored flow %v still on the dead relay %v later", c, DefaultCheckTimeout)
		}
	}
	f.probeUnanswered()
	if n := f.suspects(); n != 1 {
		t.Errorf("after three flows left it, %v relays suspect for everyone, want 1", n)
	}
	fresh := f.clientOf(relay12, more[1])
	if to := f.forward(fresh, f.check(t, 0x12, 9, 0)); to != relay12b {
		t.Errorf("a new flow went to the relay three flows left: %v", to)
	}
}

// TestRepliesThroughOldRelayDoNotHideDeadOne: a stall of the machine makes
// a flow's live relay look silent, and the flow moves to the cluster's
// other relay, which is dead but still listed. The pod goes on sending
// through the live relay (it answers through the relay its last datagram
// came from), so replies keep arriving — but not through the relay the
// flow now sends to. They must not count as that relay's: the flow leaves
// the dead relay and returns to the live one. (In the soak they did, and
// every call lost its uplink for 8.7 s, until the replica restarted.)
func TestRepliesThroughOldRelayDoNotHideDeadOne(t *testing.T) {
	f := newFailoverUnit(t)
	a := clientRanking(t, relay12, relay12b)
	f.open(a, 7)
	f.call(a, 0, time.Second, all)
	// relay12b dies; the process stalls 800 ms: no datagram either way.
	at := 1800 * time.Millisecond
	f.at(at)
	if to := f.forward(a, media); to != relay12b {
		t.Fatalf("after the stall the flow went to %v, want the other relay %v (silence)", to, relay12b)
	}
	back := time.Duration(0)
	for at += 20 * time.Millisecond; at < 6*time.Second && back == 0; at += 20 * time.Millisecond {
		f.at(at.Truncate(clockTick))
		to := f.forward(a, media)
		if to == relay12 {
			back = at - 1800*time.Millisecond
		}
		f.answer(a, relay12) // the pod's downlink, through the relay it last heard from
	}
	t.Logf("back on the live relay after %v", back)
	if limit := 2*DefaultSilenceAfter + 2*clockTick; back == 0 || back > limit {
		t.Errorf("the flow returned to its live relay after %v, want within %v", back, limit)
	}
}

// TestSuspicionNeedsTheRelaySilent: three sessions of one attacker leave
// their checks through a healthy relay unanswered (wrong
// MESSAGE-INTEGRITY, which only the pod can tell) while a call on the same
// relay is answered as usual. The votes count, but the relay is not made
// suspect: it has delivered to another flow since the attacker's checks
// went through it, evidence no caller can fabricate, so the call stays and
// new flows still go there. Without that confirmation the three tokens
// turned every flow away from the relay.
func TestSuspicionNeedsTheRelaySilent(t *testing.T) {
	f := newFailoverUnit(t)
	honest := f.clients[relay12]
	f.open(honest, 7)
	attackers := map[netip.AddrPort]uint16{}
	prev := netip.AddrPortFrom(honest.Addr(), 50000)
	for i := range 3 {
		prev = f.clientOf(relay12, prev)
		attackers[prev] = uint16(20 + i)
	}
	for cl, pod := range attackers {
		f.at(0)
		f.answer(cl, f.forward(cl, f.check(t, 0x12, pod, 0)))
	}
	end := 220*time.Millisecond + DefaultCheckTimeout + 200*time.Millisecond
	for at := time.Duration(0); at < end; at += 20 * time.Millisecond {
		f.at(at)
		if to := f.forward(honest, media); to != relay12 {
			t.Fatalf("at %v the honest call left its healthy relay for %v", at, to)
		}
		f.answer(honest, relay12)
		if at == 220*time.Millisecond {
			for cl, pod := range attackers { // never answered: the pod drops them
				f.forward(cl, f.check(t, 0x12, pod, 0))
			}
		}
		if at >= 220*time.Millisecond+DefaultCheckTimeout {
			for cl := range attackers {
				f.forward(cl, media)
			}
		}
	}
	if n := f.repicks(RepickCheck); n != 3 {
		t.Errorf("repicks{check} = %v, want the attacker's 3 flows", n)
	}
	if n := f.suspects(); n != 0 {
		t.Errorf("three tokens of one attacker made %d healthy relays suspect for every flow, want 0", n)
	}
	if n := counter(t, f.reg, "rtcedge_globalrelay_relay_suspicions_refused_total", "", ""); n < 1 {
		t.Errorf("relay_suspicions_refused_total = %v, want the attacker's vote counted", n)
	}
	if to := f.forward(f.clientOf(relay12, prev), f.check(t, 0x12, 30, 0)); to != relay12 {
		t.Errorf("a new flow was sent to %v, want the healthy relay its client hashes to", to)
	}
}

// liveClusterRelay runs a real cluster relay of cluster 0x12 on loopback
// (it answers relay probes; no pods) and returns its address.
func liveClusterRelay(t *testing.T) (*clusterrelay.Relay, netip.AddrPort) {
	t.Helper()
	cr, err := clusterrelay.New(clusterrelay.Config{Cluster: 0x12, Pods: clusterrelay.NewPods(nil), Hop: testHop.For(0x12), Logger: quiet}, listen(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cr.Run(context.Background()) }()
	t.Cleanup(func() { cr.Close(); <-done })
	return cr, cr.Addr()
}

// deliverProbeAnswer reads the next datagram on the unit's internal
// socket (the unit runs no read loop), hands it to the return path as if
// it came from relay, and returns it.
func (f *failoverUnit) deliverProbeAnswer(relay netip.AddrPort) []byte {
	f.t.Helper()
	in := f.r.workers[0].Internal
	_ = in.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, encap.MaxDatagram)
	n, from, err := in.ReadFromUDPAddrPort(buf)
	if err != nil {
		f.t.Fatalf("no answer from the cluster relay %v: %v", relay, err)
	}
	if from != relay {
		f.t.Fatalf("datagram from %v, want the cluster relay %v", from, relay)
	}
	answer := bytes.Clone(buf[:n])
	f.r.toClient(buf, n, from)
	return answer
}

// attack opens, from at on, one call for each of pods from a fresh
// client address whose flow hashes to relay (after prev), answered for
// 200 ms; then each call's check goes unanswered and its next datagram,
// CheckTimeout later, leaves relay. It returns the time of those
// datagrams and the last client address used.
func (f *failoverUnit) attack(relay, prev netip.AddrPort, at time.Duration, pods ...uint16) (time.Duration, netip.AddrPort) {
	f.t.Helper()
	clients := map[netip.AddrPort]uint16{}
	for _, pod := range pods {
		prev = f.clientOf(relay, prev)
		clients[prev] = pod
	}
	for cl, pod := range clients {
		f.at(at)
		f.answer(cl, f.forward(cl, f.check(f.t, 0x12, pod, 0)))
		f.call(cl, at, 200*time.Millisecond, all)
	}
	f.at(at + 220*time.Millisecond)
	for cl, pod := range clients { // never answered: the pod drops them
		if to := f.forward(cl, f.check(f.t, 0x12, pod, 0)); to != relay {
			f.t.Fatalf("check went to %v, want %v", to, relay)
		}
	}
	at += 220*time.Millisecond + DefaultCheckTimeout
	f.at(at)
	for cl := range clients {
		if to := f.forward(cl, media); to == relay {
			f.t.Fatalf("after an unanswered check the flow of %v still uses %v", cl, to)
		}
	}
	return at, prev
}

// TestOwnSessionsAloneCannotMakeRelaySuspect: the attack
// TestSuspicionNeedsTheRelaySilent leaves open. At a replica where one
// attacker's three calls (three tokens it got through signaling) are a
// healthy cluster relay's only traffic, their checks go unanswered (a
// wrong MESSAGE-INTEGRITY, which only the pod can tell): three sessions'
// evidence, and the relay has delivered to no other flow since, because
// there is none. The relay must still not become suspect: before it does,
// the global relay asks it with a relay probe, which the live relay
// answers and no caller can forge or suppress. New calls keep going there.
// The attack repeated sends no second probe within voteWindow, a replayed
// answer counts for nothing, and once the relay really dies the next
// vote's probe goes unanswered and it is suspect.
func TestOwnSessionsAloneCannotMakeRelaySuspect(t *testing.T) {
	f := newFailoverUnit(t)
	cr, live := liveClusterRelay(t)
	dir := f.r.cfg.Directory.(*Clusters)
	dir.Set([]Replica{{Cluster: 0x12, Addr: live}, {Cluster: 0x12, Addr: relay12b}})
	sent := func() float64 {
		return counter(t, f.reg, "rtcedge_globalrelay_relay_probes_total", "result", ProbeSent)
	}
	at, prev := f.attack(live, netip.MustParseAddrPort("127.0.0.1:50000"), 0, 20, 21, 22)
	if n := f.repicks(RepickCheck); n != 3 {
		t.Errorf("repicks{check} = %v, want the attacker's 3 flows", n)
	}
	if n := f.suspects(); n != 0 {
		t.Fatalf("three tokens of one attacker, the relay's only traffic, made %d healthy relays suspect for every flow, want 0", n)
	}
	// The live relay answers the probe; the wait for it ends.
	answer := f.deliverProbeAnswer(live)
	f.at(at + DefaultCheckTimeout)
	if n := f.suspects(); n != 0 {
		t.Errorf("%d relays suspect after the relay answered its probe, want 0", n)
	}
	if n := counter(t, f.reg, "rtcedge_globalrelay_relay_probes_total", "result", ProbeAnswered); n != 1 {
		t.Errorf("relay_probes_total{answered} = %v, want 1", n)
	}
	prev = f.clientOf(live, prev)
	if to := f.forward(prev, f.check(t, 0x12, 30, 0)); to != live {
		t.Errorf("a new flow was sent to %v, want the healthy relay its client hashes to", to)
	}
	// The answer replayed (by a host that captured it) counts for nothing.
	f.r.toClient(bytes.Clone(answer), len(answer), live)
	if n := counter(t, f.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "probe_unmatched"); n != 1 {
		t.Errorf("drops{probe_unmatched} = %v after a replayed answer, want 1", n)
	}

	// The attack again at once, with three more tokens: the vote stands
	// (nothing delivered since), but no second probe goes out within
	// voteWindow, and the relay is not suspect.
	refused := counter(t, f.reg, "rtcedge_globalrelay_relay_suspicions_refused_total", "", "")
	at, prev = f.attack(live, prev, at+DefaultCheckTimeout, 23, 24, 25)
	f.at(at + DefaultCheckTimeout)
	if n := counter(t, f.reg, "rtcedge_globalrelay_relay_suspicions_refused_total", "", ""); n != refused {
		t.Errorf("suspicions_refused_total %v → %v: the second vote did not stand, so it tests no rate limit", refused, n)
	}
	if n := sent(); n != 1 {
		t.Errorf("relay_probes_total{sent} = %v after a second vote within %v, want 1", n, voteWindow)
	}
	if n := f.suspects(); n != 0 {
		t.Errorf("the repeated attack made %d relays suspect, want 0", n)
	}

	// The relay dies. Three sessions' evidence after voteWindow: a new
	// probe, unanswered, and the relay is suspect.
	cr.Close()
	at, _ = f.attack(live, prev, at+voteWindow, 26, 27, 28)
	if n := sent(); n != 2 {
		t.Fatalf("relay_probes_total{sent} = %v, want a second probe after %v", n, voteWindow)
	}
	if n := f.suspects(); n != 0 {
		t.Fatalf("%d relays suspect before the probe's wait ended", n)
	}
	f.at(at + time.Duration(f.r.probeWait(0x12)))
	if n := f.suspects(); n != 1 {
		t.Errorf("the dead relay left its probe unanswered: %d relays suspect, want 1", n)
	}
}

// TestProbeRoundTripOnRunningRelays: a running global relay (its read
// loops and clock tick, on both I/O paths) probes a running cluster
// relay, whose answer comes back through the return path and counts as
// answered; a probe to a socket that never answers is judged by the clock
// tick and makes that relay suspect.
func TestProbeRoundTripOnRunningRelays(t *testing.T) {
	for _, loop := range []bool{false, true} {
		t.Run(map[bool]string{false: "read-loops", true: "event-loop"}[loop], func(t *testing.T) {
			_, live := liveClusterRelay(t)
			r := newRig(t, Config{Tuning: udpio.Tuning{Batch: 32, EventLoop: &loop}})
			dir := r.relay.cfg.Directory.(*Clusters)
			dir.Set([]Replica{{Cluster: 0x12, Addr: live}, {Cluster: 0x12, Addr: addrOf(r.cluster)}})
			r.relay.probeRelay(live, 0x12, r.relay.now.Load())
			waitCounter(t, r.reg, "rtcedge_globalrelay_relay_probes_total", "result", ProbeAnswered, 1)
			r.relay.probeRelay(addrOf(r.cluster), 0x12, r.relay.now.Load()) // reads nothing, answers nothing
			waitCounter(t, r.reg, "rtcedge_globalrelay_relay_probes_total", "result", ProbeUnanswered, 1)
			if u := r.relay.suspects.until(addrOf(r.cluster)); u == 0 {
				t.Error("the relay that left its probe unanswered is not suspect")
			}
			if u := r.relay.suspects.until(live); u != 0 {
				t.Error("the relay that answered is suspect")
			}
		})
	}
}

// TestBumpToCountsEveryBump: the flow's watch is bumped from the client
// path and the return path at once; a load-then-store would lose bumps.
// Two goroutines bump one counter 50,000 times each: all count, and the
// limit holds.
func TestBumpToCountsEveryBump(t *testing.T) {
	const each = 50000
	var v atomic.Int32
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				bumpTo(&v, 1<<30)
			}
		}()
	}
	wg.Wait()
	if got := v.Load(); got != 2*each {
		t.Errorf("after %d bumps from two goroutines, %d", 2*each, got)
	}
	var capped atomic.Int32
	for range 10 {
		bumpTo(&capped, maxStrikes)
	}
	if got := capped.Load(); got != maxStrikes {
		t.Errorf("bumped 10 times up to %d: %d", maxStrikes, got)
	}
}
