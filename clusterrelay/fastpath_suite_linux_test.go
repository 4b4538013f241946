package clusterrelay

// The relay's attack suites and a hop key rotation over a veth pair
// between two network namespaces, with fast_path off and auto: the same
// tests, the same verdicts and the same drops under the same reasons,
// with the flows' datagrams forwarded by the kernel.

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// fastModes are the modes each test here runs in: off, and auto, the
// default, which attaches over veth (vethNet fails a test where it did
// not, so a silent fallback cannot pass for the fast path).
var fastModes = []fastpath.Mode{fastpath.ModeOff, fastpath.ModeAuto}

// vethNet is a testNet over a veth pair: the relay's socket in one
// namespace (where its program attaches), every peer in the other. With
// the fast path on, the test fails unless the program saw its datagrams
// and, if forwards, forwarded some of them.
func vethNet(t *testing.T, mode fastpath.Mode, forwards bool) testNet {
	t.Helper()
	p := fptest.NewPair(t)
	return testNet{
		peer:  func(testing.TB) *net.UDPConn { return p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 0)) },
		relay: func(testing.TB) *net.UDPConn { return p.B.ListenUDP(netip.AddrPortFrom(p.AddrB, 0)) },
		in:    p.B.In, addr: p.AddrB, fast: mode,
		done: func(t *testing.T, r *Relay) {
			if mode == fastpath.ModeOff {
				if r.kernel != nil {
					t.Error("fast_path off, yet the program is attached")
				}
				return
			}
			s := kernelStats(t, r)
			var seen uint64
			for _, c := range s {
				seen += c.Packets
			}
			if fw := s[fastpath.ForwardPod].Packets + s[fastpath.ForwardClient].Packets; seen == 0 || forwards && fw == 0 {
				t.Errorf("the kernel saw %d datagrams and forwarded %d: the test never reached the fast path", seen, fw)
			}
		},
	}
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
// garbage, forged, replayed, truncated and extended datagrams, wrong
// clusters, unknown pods, spoofed senders and ingresses
// (TestForwardAndDrop), forged, replayed and misdirected probes
// (TestProbeAnsweredOnlyWhenAuthentic) — over veth with fast_path off and
// auto: each refused datagram is counted once under the reason it has
// without the fast path and reaches nobody, while the good datagrams
// beside them cross the kernel.
func TestAttackSuitesWithFastPath(t *testing.T) {
	for _, mode := range fastModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Run("forward and drop", func(t *testing.T) {
				loop := false
				testForwardAndDrop(t, vethNet(t, mode, true), udpio.Tuning{Batch: 32, EventLoop: &loop})
			})
			t.Run("probes", func(t *testing.T) { testProbeAnsweredOnlyWhenAuthentic(t, vethNet(t, mode, false)) })
		})
	}
}

// TestKeyRotationWithFastPath: a hop key rotation on a running relay
// whose program forwards a flow both ways, over veth, fast_path off and
// auto. The new key is added and made current (datagrams under either key
// pass), then the old one is retired: from then on a datagram sealed with
// it, toward the pod or toward the client, reaches no one and is counted as
// encap_unknown_key, exactly as in user space — the kernel holds no key
// user space would not accept — while the flow goes on in the kernel
// under the new key.
func TestKeyRotationWithFastPath(t *testing.T) {
	for _, mode := range fastModes {
		for _, derived := range []bool{false, true} {
			t.Run(string(mode)+map[bool]string{false: "/static", true: "/derived"}[derived], func(t *testing.T) {
				testKeyRotation(t, mode, derived)
			})
		}
	}
}

// hopRing is cluster 5's keyring of key IDs ids (fptest.HopRing).
func hopRing(t *testing.T, derived bool, current uint8, ids ...uint8) *encap.Keyring {
	return fptest.HopRing(t, 5, derived, current, ids...)
}

// testKeyRotation runs TestKeyRotationWithFastPath with static or derived
// keys.
func testKeyRotation(t *testing.T, mode fastpath.Mode, derived bool) {
	n := vethNet(t, mode, true)
	pod, ingress := n.peer(t), n.peer(t)
	reg := prometheus.NewRegistry()
	old, both, rotated := hopRing(t, derived, 2, 2), hopRing(t, derived, 3, 2, 3), hopRing(t, derived, 3, 3)
	r := n.start(t, Config{Cluster: 5, Pods: NewPods(map[uint16]netip.AddrPort{1: addrOf(pod)}), Hop: old,
		Logger: quiet, Registerer: reg})
	h := encap.Header{Cluster: 5, Pod: 1, POP: 1, Client: netip.MustParseAddrPort("198.51.100.7:40000"), Ingress: addrOf(ingress)}
	down := h
	down.ToClient = true
	// talk sends rounds both ways sealed with key and awaits each at the
	// other end unchanged; with the fast path on, the kernel must forward
	// most of them.
	talk := func(what string, key *encap.Keyring) {
		t.Helper()
		var pod0, client0 uint64
		if mode != fastpath.ModeOff {
			s := kernelStats(t, r)
			pod0, client0 = s[fastpath.ForwardPod].Packets, s[fastpath.ForwardClient].Packets
		}
		for i := range 10 {
			for _, leg := range []struct {
				h        encap.Header
				from, to *net.UDPConn
			}{{h, ingress, pod}, {down, pod, ingress}} {
				pkt := seal(t, key, leg.h, fmt.Sprintf("%s %d", what, i))
				if _, err := leg.from.WriteToUDPAddrPort(pkt, r.Addr()); err != nil {
					t.Fatal(err)
				}
				if got := read(t, leg.to); !bytes.Equal(got, pkt) {
					t.Fatalf("%s: got % x, want % x", what, got, pkt)
				}
			}
		}
		if mode != fastpath.ModeOff {
			s := kernelStats(t, r)
			if p, c := s[fastpath.ForwardPod].Packets-pod0, s[fastpath.ForwardClient].Packets-client0; p < 5 || c < 5 {
				t.Fatalf("%s: the kernel forwarded %d toward the pod and %d toward the client of 10 each", what, p, c)
			}
		}
	}
	talk("before the rotation", old)
	r.SetHopKeys(both)
	talk("new key current", both)
	talk("old key still held", old)
	r.SetHopKeys(rotated)
	talk("old key retired", rotated)

	const forged = 5
	var key0 uint64
	if mode != fastpath.ModeOff {
		key0 = kernelStats(t, r)[reasonIndex(t, "key")].Packets
	}
	before := drops(t, reg, "encap_unknown_key")
	for i := range forged {
		_, _ = ingress.WriteToUDPAddrPort(seal(t, old, h, fmt.Sprint("retired up ", i)), r.Addr())
		_, _ = pod.WriteToUDPAddrPort(seal(t, old, down, fmt.Sprint("retired down ", i)), r.Addr())
	}
	awaitDrops(t, reg, "encap_unknown_key", before+2*forged)
	talk("after the retired key's datagrams", rotated) // the first thing through each way
	if v := drops(t, reg, "encap_unknown_key") - before; v != 2*forged {
		t.Errorf("encap_unknown_key drops = %v, want %d", v, 2*forged)
	}
	if mode != fastpath.ModeOff {
		if v := kernelStats(t, r)[reasonIndex(t, "key")].Packets - key0; v != 2*forged {
			t.Errorf("the kernel passed up %d datagrams under the retired key as key, want %d", v, 2*forged)
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

// TestKernelKeysFollowRotationDuringDirectoryChanges: a rotation while the
// pod directory changes (the gossip watcher and the key reload are two
// goroutines) must leave the kernel holding exactly the keys user space
// holds. Each push of the directory also pushes the keys; one that read
// the keyring before a rotation and wrote it after would put the retired
// key back, and the kernel would accept it until the next change.
func TestKernelKeysFollowRotationDuringDirectoryChanges(t *testing.T) {
	n := vethNet(t, fastpath.ModeTC, false)
	n.done = nil // no datagrams: the maps are what is checked
	pods := NewPods(nil)
	r := n.start(t, Config{Cluster: 5, Pods: pods, Hop: testHop, Logger: quiet, Registerer: prometheus.NewRegistry()})
	rings := [2]*encap.Keyring{}
	for i, id := range []uint8{2, 3} {
		k, err := encap.NewKeyring(id, map[uint8][]byte{id: bytes.Repeat([]byte{id}, encap.KeyLen)})
		if err != nil {
			t.Fatal(err)
		}
		rings[i] = k
	}
	const rounds = 200
	for i := range rounds {
		next := rings[(i+1)%2]
		// The directory changes all through the rotation.
		stop, busy := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				pods.Set(map[uint16]netip.AddrPort{uint16(j%7 + 1): netip.MustParseAddrPort("10.77.0.1:5000")})
				if j == 3 {
					close(busy)
				}
			}
		})
		<-busy
		r.SetHopKeys(next)
		close(stop)
		wg.Wait()
		ids, err := r.kernel.fp.KeyIDs(5)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, next.KeyIDs()) {
			t.Fatalf("round %d: the kernel accepts key IDs %v, user space %v", i, ids, next.KeyIDs())
		}
	}
}
