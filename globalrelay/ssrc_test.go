package globalrelay

// Tests of following a caller's audio to a new address by its SSRC, and
// the bounds of the SSRC index.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// rtpFrom returns an RTP datagram of the given SSRC.
func rtpFrom(ssrc uint32) []byte {
	return []byte{0x80, 111, 0, 1, 0, 0, 0, 1, byte(ssrc >> 24), byte(ssrc >> 16), byte(ssrc >> 8), byte(ssrc), 9, 9, 9, 9}
}

// TestSSRCFollowsSilentFlow: audio from an unknown address whose SSRC is a
// flow's opens a flow there with that flow's cluster, pod and token — only
// once the old flow has been silent for followSilence, never for an SSRC
// no flow sent, never for RTCP; the old flow stays. A flow of another token
// sending the same SSRC does not take it over. Without the SSRC index every
// such datagram is dropped as unknown_flow until the client's next check.
func TestSSRCFollowsSilentFlow(t *testing.T) {
	u := newUnit(t, Config{})
	old := netip.MustParseAddrPort("198.51.100.7:50000")
	moved := netip.MustParseAddrPort("198.51.100.7:50001")
	stranger := netip.MustParseAddrPort("203.0.113.9:4000")
	u.at(0)
	want, ok := u.send(t, old, u.check(t, 0x12, 3, 0))
	if !ok {
		t.Fatal("the caller's check was not forwarded")
	}
	for i := range 5 {
		u.at(time.Duration(i) * 20 * time.Millisecond)
		if _, ok := u.send(t, old, rtpFrom(0xcafe)); !ok {
			t.Fatal("the caller's audio was not forwarded")
		}
	}
	// Someone with a session of its own (another token) sends audio with
	// the caller's SSRC from its own flow: it does not take the SSRC.
	intruder := netip.MustParseAddrPort("203.0.113.66:7000")
	if _, ok := u.send(t, intruder, u.check(t, 0x12, 4, 0)); !ok {
		t.Fatal("the intruder's own check was not forwarded")
	}
	if _, ok := u.send(t, intruder, rtpFrom(0xcafe)); !ok {
		t.Fatal("the intruder's audio on its own flow was not forwarded")
	}
	// The NAT rebinds: audio from the new address 20 ms after the last
	// from the old one.
	u.at(100 * time.Millisecond)
	if _, ok := u.send(t, moved, rtpFrom(0xcafe)); ok {
		t.Fatal("audio with a live flow's SSRC opened a flow for another address")
	}
	if n := u.drops(t, dropLabels[dropSSRCLive]); n != 1 {
		t.Errorf("ssrc_live drops %v, want 1", n)
	}
	u.at(80*time.Millisecond + followSilence)
	if _, ok := u.send(t, stranger, rtpFrom(0xbeef)); ok {
		t.Error("audio with an SSRC no flow sent was forwarded")
	}
	rtcp := []byte{0x80, 200, 0, 6, 0, 0, 0xca, 0xfe, 0, 0, 0, 0}
	if _, ok := u.send(t, stranger, rtcp); ok {
		t.Error("RTCP naming the flow's SSRC as its sender opened a flow")
	}
	got, ok := u.send(t, moved, rtpFrom(0xcafe))
	if !ok {
		t.Fatal("audio from the rebound address was not forwarded once the old flow was silent")
	}
	if got.Cluster != want.Cluster || got.Pod != want.Pod || got.Token != want.Token || got.Client != moved {
		t.Errorf("followed flow %+v, want cluster %#x pod %d token %x client %v", got, want.Cluster, want.Pod, want.Token, moved)
	}
	if u.r.flows.get(old) == nil || u.r.Flows() != 3 {
		t.Errorf("flows %d (old kept: %v), want the old, the new and the intruder's", u.r.Flows(), u.r.flows.get(old) != nil)
	}
	if n := counter(t, u.reg, "rtcedge_globalrelay_flows_followed_total", "", ""); n != 1 {
		t.Errorf("flows_followed_total %v, want 1", n)
	}
	// The new address is the SSRC's now: a second rebind follows it.
	u.at(100*time.Millisecond + 2*followSilence)
	if _, ok := u.send(t, netip.MustParseAddrPort("198.51.100.7:50002"), rtpFrom(0xcafe)); !ok {
		t.Error("a second rebind did not follow the new address")
	}
}

// TestSSRCIndexBoundedPerFlow: a flow that keeps changing the SSRC of its
// RTP holds one index entry, its latest, however many it sends; other
// calls' SSRCs are untouched. Without the drop of a flow's previous entry,
// one caller sending fresh SSRCs grew the index by an entry a datagram
// (~117 B each) and every sweep walked them under the shard locks.
func TestSSRCIndexBoundedPerFlow(t *testing.T) {
	u := newUnit(t, Config{})
	victim := netip.MustParseAddrPort("198.51.100.7:50000")
	attacker := netip.MustParseAddrPort("203.0.113.9:4000")
	u.at(0)
	for _, c := range []struct {
		from netip.AddrPort
		pod  uint16
	}{{victim, 3}, {attacker, 4}} {
		if _, ok := u.send(t, c.from, u.check(t, 0x12, c.pod, 0)); !ok {
			t.Fatalf("the check from %v was not forwarded", c.from)
		}
	}
	if _, ok := u.send(t, victim, rtpFrom(0xcafe)); !ok {
		t.Fatal("the victim's audio was not forwarded")
	}
	const n = 20000
	for i := range n {
		if _, ok := u.send(t, attacker, rtpFrom(0x10000+uint32(i))); !ok {
			t.Fatalf("the attacker's audio %d was not forwarded", i)
		}
	}
	if got := u.r.ssrcs.len(); got != 2 {
		t.Errorf("SSRC index holds %d entries after %d fresh SSRCs from one flow, want 2 (one per flow)", got, n)
	}
	if e, ok := u.r.ssrcs.get(0x10000 + n - 1); !ok || e.addr != attacker {
		t.Errorf("the attacker's latest SSRC is not indexed: %+v %v", e, ok)
	}
	if e, ok := u.r.ssrcs.get(0xcafe); !ok || e.addr != victim {
		t.Errorf("the victim's SSRC entry was lost: %+v %v", e, ok)
	}
}

// TestSSRCIndexBoundedPerToken: one token's flows (as many addresses as
// it may open, and more tried) each sending fresh SSRCs, and audio from
// further addresses following them, hold at most one index entry per flow
// of the token: maxFlowsPerToken in all.
func TestSSRCIndexBoundedPerToken(t *testing.T) {
	u := newUnit(t, Config{})
	u.at(0)
	check := u.check(t, 0x12, 4, 0) // one token, sent from every address
	ssrc := uint32(0x20000)
	for i := range 4 * maxFlowsPerToken {
		from := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.9"), uint16(4000+i))
		u.send(t, from, check)
		for range 100 {
			ssrc++
			u.send(t, from, rtpFrom(ssrc))
		}
	}
	u.at(2 * followSilence)
	for i := range 4 * maxFlowsPerToken { // follow the latest SSRC from new addresses
		u.send(t, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), uint16(4000+i)), rtpFrom(ssrc))
	}
	if got := u.r.ssrcs.len(); got > maxFlowsPerToken {
		t.Errorf("SSRC index holds %d entries for one token, want at most %d (one per flow of the token)", got, maxFlowsPerToken)
	}
}

// TestFreshSSRCFloodBoundedMemory is the goal of docs/network-changes.md:
// a flow sending 1M RTP packets with fresh SSRCs grows the replica by
// under 10 MB, and a call beside it, on the same relay, keeps under 1 %
// loss. The call runs on real loopback sockets through the relay's worker
// and a cluster relay that echoes.
func TestFreshSSRCFloodBoundedMemory(t *testing.T) {
	r := newRig(t, Config{})
	stopEcho := echoCluster(t, r.cluster)
	defer stopEcho()
	attacker := listen(t)
	defer attacker.Close()
	for _, c := range []*net.UDPConn{r.client, attacker} { // two calls' flows
		if _, err := c.WriteToUDPAddrPort(r.validCheck(t, 3), r.pub); err != nil {
			t.Fatal(err)
		}
		read(t, c) // the check's echo: the flow is open
		_ = c.SetReadDeadline(time.Time{})
	}
	settle := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}

	// The call: one packet every 20 ms, its echoes counted.
	var echoed atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := r.client.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			echoed.Add(1)
		}
	}()
	stopCall := make(chan struct{})
	endCall := sync.OnceFunc(func() { close(stopCall) })
	defer endCall() // also on a failure before the end
	callDone := make(chan int, 1)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		sent := 0
		for {
			select {
			case <-stopCall:
				callDone <- sent
				return
			case <-tick.C:
				if _, err := r.client.WriteToUDPAddrPort(rtpFrom(0xcafe), r.pub); err == nil {
					sent++
				}
			}
		}
	}()

	before := settle()
	// The flood: the attacker's datagrams go through the relay's own client
	// path (parse, flow, SSRC index, header), from this goroutine beside
	// the worker that carries the call, as a second worker would; only the
	// syscalls are skipped, which on this shared machine would take minutes
	// for 1M datagrams.
	const n = 1_000_000
	from := addrOf(attacker)
	deadline := time.Now().Add(4 * time.Minute)
	buf := make([]byte, encap.MaxLen+encap.MaxPayload)
	pkt := buf[encap.MaxLen:][:copy(buf[encap.MaxLen:], rtpFrom(0))]
	sent := 0
	for ; sent < n && (sent%4096 != 0 || time.Now().Before(deadline)); sent++ {
		binary.BigEndian.PutUint32(pkt[8:12], 0x100000+uint32(sent))
		if _, _, ok := r.relay.fromClient(buf, len(pkt), from, r.ingress); !ok {
			t.Fatalf("the flood's datagram %d was not forwarded", sent)
		}
	}
	if sent < n {
		t.Fatalf("sent %d of %d datagrams before the deadline", sent, n)
	}
	grown := int64(settle()) - int64(before)
	endCall()
	callSent := <-callDone
	time.Sleep(100 * time.Millisecond) // the last echoes in flight on loopback
	lost := callSent - int(echoed.Load())
	t.Logf("1M fresh SSRCs: heap grew %d KiB; SSRC index %d entries; the call beside it: %d of %d echoed",
		grown>>10, r.relay.ssrcs.len(), echoed.Load(), callSent)
	if grown > 10<<20 {
		t.Errorf("heap grew %d MiB under a flow's 1M fresh SSRCs, want < 10", grown>>20)
	}
	if callSent == 0 || float64(lost) > 0.01*float64(callSent) {
		t.Errorf("the call beside the flood lost %d of %d packets, want < 1 %%", lost, callSent)
	}
}

// echoCluster plays a cluster relay and its pods on c: every datagram
// toward a pod comes back toward its client, sealed. It returns a stop
// that waits for it.
func echoCluster(t *testing.T, c *net.UDPConn) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, _, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			h, _, err := encap.Decode(buf[:n])
			if err != nil {
				continue
			}
			h.ToClient = true
			hl, _ := h.Put(buf)
			testHop.For(h.Cluster).Seal(buf[:n], hl)
			_, _ = c.WriteToUDPAddrPort(buf[:n], h.Ingress)
		}
	}()
	return func() { c.Close(); <-done }
}
