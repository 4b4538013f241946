package globalrelay

// The relay's attack suites, a hop key rotation and a flow takeover over a
// veth pair between two network namespaces, with fast_path off and auto:
// the same tests, the same verdicts and the same drops under the same
// reasons, with the established flows forwarded by the kernel.

import (
	"bytes"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
)

// fastModes are the modes each test here runs in: off, and auto, the
// default, which attaches over veth (vethNet fails a test where it did
// not, so a silent fallback cannot pass for the fast path).
var fastModes = []fastpath.Mode{fastpath.ModeOff, fastpath.ModeAuto}

// vethNet is a testNet over a veth pair: the relay's sockets in one
// namespace (where its programs attach), every peer in the other.
func vethNet(t *testing.T, mode fastpath.Mode) (testNet, *fptest.Pair) {
	t.Helper()
	p := fptest.NewPair(t)
	return testNet{
		peer:  func(testing.TB) *net.UDPConn { return p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 0)) },
		relay: func(testing.TB) *net.UDPConn { return p.B.ListenUDP(netip.AddrPortFrom(p.AddrB, 0)) },
		in:    p.B.In, fast: mode,
		done: func(t *testing.T, r *Relay) {
			if mode == fastpath.ModeOff {
				if r.kernel != nil {
					t.Error("fast_path off, yet the programs are attached")
				}
				return
			}
			if up, down := kernelForwards(t, r); up+down == 0 {
				t.Error("the kernel forwarded nothing: the test never reached the fast path")
			}
		},
	}, p
}

// kernelForwards is what the relay's programs have forwarded each way;
// the test fails where they are not attached.
func kernelForwards(t *testing.T, r *Relay) (up, down uint64) {
	t.Helper()
	s := kernelStats(t, r)
	return s[fastpath.ForwardUp].Packets, s[fastpath.ForwardDown].Packets
}

func kernelStats(t *testing.T, r *Relay) [fastpath.NumReasons]fastpath.Count {
	t.Helper()
	if r.kernel == nil {
		t.Fatal("fast_path auto did not attach over veth")
	}
	s, err := r.kernel.fp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestAttackSuitesWithFastPath runs the relay's own attack tests —
// garbage, forged and malformed checks from anyone (TestBadInputDroppedAndCounted),
// spoofed, misdirected and mismatched replies on the return path
// (TestReturnPathTrust) — over veth with fast_path off and auto: each
// refused datagram is counted once under the reason it has without the
// fast path, and reaches nobody, while the flows they aim at are in the
// kernel.
func TestAttackSuitesWithFastPath(t *testing.T) {
	for _, mode := range fastModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Run("bad input", func(t *testing.T) { n, _ := vethNet(t, mode); testBadInputDroppedAndCounted(t, n) })
			t.Run("return path trust", func(t *testing.T) { n, _ := vethNet(t, mode); testReturnPathTrust(t, n) })
			t.Run("spoofed check on a live flow", func(t *testing.T) { testSpoofedCheckOnLiveFlow(t, mode) })
		})
	}
}

// rtpSeq is an RTP packet of SSRC 1, sequence seq.
func rtpSeq(seq int) []byte {
	return append([]byte{0x80, 111, byte(seq >> 8), byte(seq), 0, 0, 0, 1, 0, 0, 0, 1}, bytes.Repeat([]byte{0x5a}, 60)...)
}

// receive reads the next datagram at the cluster relay: it must verify
// under ring and carry payload; its header is returned.
func receive(t *testing.T, cluster *net.UDPConn, ring *encap.Keyring, payload []byte) encap.Header {
	t.Helper()
	got, _ := read(t, cluster)
	h, hl, err := encap.Decode(got)
	if err == nil {
		err = ring.Verify(got, hl)
	}
	if err != nil || !bytes.Equal(got[hl:], payload) {
		t.Fatalf("the cluster relay got %+v (%v) + % x, want % x", h, err, got[min(hl, len(got)):], payload)
	}
	return h
}

// testSpoofedCheckOnLiveFlow is TestSpoofedCheckCannotMoveLiveFlow on a
// running relay: a caller talks (RTP every 20 ms, forwarded by the kernel
// with the fast path on, where user space sees none of it) while an
// attacker spoofs the caller's address with a valid check for another pod.
// No check may move the flow: the kernel's last-seen times reach the flow
// before each check is judged, so the flow is live, and every check is
// dropped as flow_busy.
func testSpoofedCheckOnLiveFlow(t *testing.T, mode fastpath.Mode) {
	n, p := vethNet(t, mode)
	r := newRigOn(t, n, Config{FlowQuiet: 500 * time.Millisecond})
	victim := addrOf(r.client)
	if _, err := r.client.WriteToUDPAddrPort(r.validCheck(t, 1), r.pub); err != nil {
		t.Fatal(err)
	}
	read(t, r.cluster)
	hijack := r.validCheck(t, 2)
	const media, every = 100, 20 * time.Millisecond // 2 s, 4 FlowQuiet
	spoofed := 0
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := range media {
		<-tick.C
		pkt := rtpSeq(i)
		if _, err := r.client.WriteToUDPAddrPort(pkt, r.pub); err != nil {
			t.Fatal(err)
		}
		if h := receive(t, r.cluster, testHop.For(0x12), pkt); h.Pod != 1 {
			t.Fatalf("datagram %d of the caller went to pod %d", i, h.Pod)
		}
		if i%5 == 4 {
			if err := p.A.Spoof(victim, r.pub, hijack); err != nil {
				t.Fatal(err)
			}
			spoofed++
		}
	}
	waitCounter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropFlowBusy], float64(spoofed))
	if f := r.relay.flows.get(victim); f == nil || f.pod != 1 {
		t.Fatalf("the caller's flow moved: %+v", f)
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_flow_takeovers_total", "", ""); v != 0 {
		t.Errorf("%v takeovers by spoofed checks", v)
	}
	if mode != fastpath.ModeOff {
		if up, _ := kernelForwards(t, r.relay); up < media/2 {
			t.Errorf("the kernel forwarded %d of the caller's %d datagrams", up, media)
		}
	}
}

// TestKeyRotationWithFastPath: a hop key rotation on a running relay
// whose flow is in the kernel, over veth, fast_path off and auto. The new
// key is added and made current (the next datagrams toward the cluster
// are sealed with it; replies under either key reach the client), then the
// old one is retired: from then on a reply sealed with the old key reaches
// no one and is counted as encap_unknown_key, exactly as in user space —
// the kernel holds no key user space would not accept — while the flow
// goes on in the kernel under the new key.
func TestKeyRotationWithFastPath(t *testing.T) {
	for _, mode := range fastModes {
		for _, derived := range []bool{false, true} {
			t.Run(string(mode)+map[bool]string{false: "/static", true: "/derived"}[derived], func(t *testing.T) {
				testKeyRotation(t, mode, derived)
			})
		}
	}
}

// hopRing is cluster 0x12's keyring of key IDs ids (fptest.HopRing).
func hopRing(t *testing.T, derived bool, current uint8, ids ...uint8) *encap.Keyring {
	return fptest.HopRing(t, 0x12, derived, current, ids...)
}

// testKeyRotation runs TestKeyRotationWithFastPath with static or derived
// keys.
func testKeyRotation(t *testing.T, mode fastpath.Mode, derived bool) {
	n, _ := vethNet(t, mode)
	old, both, rotated := hopRing(t, derived, 1, 1), hopRing(t, derived, 2, 1, 2), hopRing(t, derived, 2, 2)
	r := newRigOn(t, n, Config{Hop: encap.NewClusterKeys(map[uint16]*encap.Keyring{0x12: old})})
	check := r.validCheck(t, 3)
	if _, err := r.client.WriteToUDPAddrPort(check, r.pub); err != nil {
		t.Fatal(err)
	}
	h := receive(t, r.cluster, old, check)
	reply := func(key *encap.Keyring, payload string) {
		t.Helper()
		back := h
		back.ToClient = true
		b, err := back.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		hl := len(b)
		b = append(b, payload...)
		key.Seal(b, hl)
		if _, err := r.cluster.WriteToUDPAddrPort(b, r.ingress); err != nil {
			t.Fatal(err)
		}
	}
	// talk sends rounds of media both ways, sealed and checked under
	// seal, and with the fast path on awaits the kernel forwarding them.
	talk := func(what string, seal, check *encap.Keyring) {
		t.Helper()
		var up0, down0 uint64
		if mode != fastpath.ModeOff {
			up0, down0 = kernelForwards(t, r.relay)
		}
		for i := range 10 {
			pkt := rtpSeq(i)
			if _, err := r.client.WriteToUDPAddrPort(pkt, r.pub); err != nil {
				t.Fatal(err)
			}
			if got := receive(t, r.cluster, check, pkt); got.KeyID != seal.CurrentKeyID() {
				t.Fatalf("%s: sealed with key %d, want %d", what, got.KeyID, seal.CurrentKeyID())
			}
			reply(seal, what)
			if back, _ := read(t, r.client); string(back) != what {
				t.Fatalf("%s: the client got %q", what, back)
			}
		}
		if mode != fastpath.ModeOff {
			if up, down := kernelForwards(t, r.relay); up-up0 < 5 || down-down0 < 5 {
				t.Fatalf("%s: the kernel forwarded %d up and %d down of 10 each", what, up-up0, down-down0)
			}
		}
	}
	talk("before the rotation", old, old)

	r.relay.SetHopKeys(encap.NewClusterKeys(map[uint16]*encap.Keyring{0x12: both}))
	talk("new key current", both, rotated)
	reply(old, "old key, still accepted")
	if back, _ := read(t, r.client); string(back) != "old key, still accepted" {
		t.Fatalf("a reply under the old key, still held, did not reach the client: %q", back)
	}

	r.relay.SetHopKeys(encap.NewClusterKeys(map[uint16]*encap.Keyring{0x12: rotated}))
	talk("old key retired", rotated, rotated)
	const forged = 5
	var key0 uint64
	if mode != fastpath.ModeOff {
		key0 = kernelStats(t, r.relay)[reasonIndex(t, "key")].Packets
	}
	for range forged {
		reply(old, "retired key")
	}
	reply(rotated, "good")
	if back, _ := read(t, r.client); string(back) != "good" {
		t.Fatalf("the client got %q first, want only the reply under the current key", back)
	}
	waitCounter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "encap_unknown_key", forged)
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "encap_unknown_key"); v != forged {
		t.Errorf("encap_unknown_key drops = %v, want %d", v, forged)
	}
	if mode != fastpath.ModeOff {
		if v := kernelStats(t, r.relay)[reasonIndex(t, "key")].Packets - key0; v != forged {
			t.Errorf("the kernel passed up %d replies under the retired key as key, want %d", v, forged)
		}
	}
}

// reasonIndex is the Reason labelled l.
func reasonIndex(t *testing.T, l string) fastpath.Reason {
	t.Helper()
	r, ok := fastpath.ReasonNamed(l)
	if !ok {
		t.Fatalf("no fast path reason %q", l)
	}
	return r
}

// TestTakeoverWithFastPath: a quiet flow taken over by a check for
// another pod (a new call from a reused port), on a running relay over
// veth, fast_path off and auto. With the old flow in the kernel, the
// takeover must leave nothing of it there: the caller's next datagrams
// go to the new pod (forwarded by the kernel again), replies in the old
// pod's name are dropped as flow_mismatch and reach no one, and the new
// pod's replies reach the caller.
func TestTakeoverWithFastPath(t *testing.T) {
	for _, mode := range fastModes {
		t.Run(string(mode), func(t *testing.T) { testTakeover(t, mode) })
	}
}

func testTakeover(t *testing.T, mode fastpath.Mode) {
	n, _ := vethNet(t, mode)
	const quiet = 300 * time.Millisecond
	r := newRigOn(t, n, Config{FlowQuiet: quiet})
	ring := testHop.For(0x12)
	// call runs a call on pod from the rig's client: its check, then
	// media both ways, with the fast path on forwarded by the kernel.
	call := func(pod uint16) {
		t.Helper()
		check := r.validCheck(t, pod)
		if _, err := r.client.WriteToUDPAddrPort(check, r.pub); err != nil {
			t.Fatal(err)
		}
		h := receive(t, r.cluster, ring, check)
		if h.Pod != pod {
			t.Fatalf("the check for pod %d went to pod %d", pod, h.Pod)
		}
		var up0, down0 uint64
		if mode != fastpath.ModeOff {
			up0, down0 = kernelForwards(t, r.relay)
		}
		h.ToClient = true
		for i := range 10 {
			pkt := rtpSeq(i)
			if _, err := r.client.WriteToUDPAddrPort(pkt, r.pub); err != nil {
				t.Fatal(err)
			}
			if got := receive(t, r.cluster, ring, pkt); got.Pod != pod {
				t.Fatalf("datagram %d went to pod %d, want %d", i, got.Pod, pod)
			}
			if _, err := r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("echo")), r.ingress); err != nil {
				t.Fatal(err)
			}
			if back, _ := read(t, r.client); string(back) != "echo" {
				t.Fatalf("the client got %q", back)
			}
		}
		if mode != fastpath.ModeOff {
			if up, down := kernelForwards(t, r.relay); up-up0 < 5 || down-down0 < 5 {
				t.Fatalf("pod %d: the kernel forwarded %d up and %d down of 10 each", pod, up-up0, down-down0)
			}
		}
	}
	call(1)
	// The caller hangs up; its port is reused for a call on pod 2 once
	// the flow has been quiet for FlowQuiet (the quiet time is the
	// scenario: there is no event to await).
	time.Sleep(quiet + 100*time.Millisecond)
	call(2)
	if v := counter(t, r.reg, "rtcedge_globalrelay_flow_takeovers_total", "", ""); v != 1 {
		t.Errorf("takeovers = %v, want 1", v)
	}
	// The old pod still answers the old call: nothing of it may reach the
	// caller, in user space or from a kernel entry left behind.
	const stale = 5
	old := encap.Header{ToClient: true, Cluster: 0x12, Pod: 1, POP: 9, Client: addrOf(r.client), Ingress: r.ingress}
	for range stale {
		if _, err := r.cluster.WriteToUDPAddrPort(seal(t, old, []byte("old call")), r.ingress); err != nil {
			t.Fatal(err)
		}
	}
	now := old
	now.Pod = 2
	if _, err := r.cluster.WriteToUDPAddrPort(seal(t, now, []byte("new call")), r.ingress); err != nil {
		t.Fatal(err)
	}
	if back, _ := read(t, r.client); string(back) != "new call" {
		t.Fatalf("the caller got %q first, want only the new pod's reply", back)
	}
	waitCounter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropFlowMismatch], stale)
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropFlowMismatch]); v != stale {
		t.Errorf("flow_mismatch drops = %v, want %d", v, stale)
	}
}

// TestRotationDuringInstall: a hop key rotation that comes while a worker
// installs a flow in the kernel — after it read the keys, before the
// install — must not leave the flow sealed with the old key: the
// rotation took every flow out of the kernel before this one went in, and
// the cluster relays may have retired the old key with it. The flow's
// datagrams after the rotation must carry the new key, as user space
// would seal them.
func TestRotationDuringInstall(t *testing.T) {
	n, _ := vethNet(t, fastpath.ModeAuto)
	old, rotated := hopRing(t, false, 1, 1), hopRing(t, false, 2, 2)
	r := newRigOn(t, n, Config{Hop: encap.NewClusterKeys(map[uint16]*encap.Keyring{0x12: old})})
	check := r.validCheck(t, 3)
	if _, err := r.client.WriteToUDPAddrPort(check, r.pub); err != nil {
		t.Fatal(err)
	}
	receive(t, r.cluster, old, check)
	// The next install of the flow (its refresh, within kernelRefresh of
	// media) meets a rotation between reading the keys and installing.
	var once sync.Once
	rotatedNow := make(chan struct{})
	hook := func() {
		once.Do(func() {
			r.relay.SetHopKeys(encap.NewClusterKeys(map[uint16]*encap.Keyring{0x12: rotated}))
			close(rotatedNow)
		})
	}
	testHookBeforeInstall.Store(&hook)
	defer testHookBeforeInstall.Store(nil)
	buf := make([]byte, 2048)
	deadline := time.Now().Add(10 * time.Second)
	for seq := 0; ; seq++ {
		select {
		case <-rotatedNow:
		default:
			if time.Now().After(deadline) {
				t.Fatal("the flow was not installed again within 10 s")
			}
			if _, err := r.client.WriteToUDPAddrPort(rtpSeq(seq), r.pub); err != nil {
				t.Fatal(err)
			}
			read(t, r.cluster)
			time.Sleep(20 * time.Millisecond)
			continue
		}
		break
	}
	// Every datagram sent from now on is sealed with the new key, whether
	// user space or the kernel forwards it; and the kernel forwards the
	// flow again.
	up0, _ := kernelForwards(t, r.relay)
	defer func() {
		if up, _ := kernelForwards(t, r.relay); up-up0 < 10 {
			t.Errorf("the kernel forwarded %d of the 20 datagrams after the rotation", up-up0)
		}
	}()
	for i := range 20 {
		media := rtpSeq(10000 + i)
		if _, err := r.client.WriteToUDPAddrPort(media, r.pub); err != nil {
			t.Fatal(err)
		}
		for {
			_ = r.cluster.SetReadDeadline(time.Now().Add(5 * time.Second))
			m, _, err := r.cluster.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("datagram %d after the rotation did not arrive: %v", i, err)
			}
			h, hl, err := encap.Decode(buf[:m])
			if err != nil || !bytes.Equal(buf[hl:m], media) {
				continue // sent before the rotation
			}
			if h.KeyID != rotated.CurrentKeyID() {
				t.Fatalf("datagram %d after the rotation sealed with key %d, want %d", i, h.KeyID, rotated.CurrentKeyID())
			}
			break
		}
	}
}
