package podnet

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// tiers is a real global relay, cluster relay and pod socket on loopback,
// wired as in production: client → global relay → cluster relay → pod.
type tiers struct {
	client          *net.UDPConn
	pub             netip.AddrPort
	pc              *popConn
	session         *muxConn // the one session the checks are for
	ufrag           string
	sock            *Socket
	gr              *globalrelay.Relay
	cr              *clusterrelay.Relay
	grReg, crReg    *prometheus.Registry
	podReg          *prometheus.Registry
	keys            *token.Keyring
	clientAddr, vip netip.AddrPort
	stop            func()
}

// testHop is the inter-tier key of cluster 7, the tests' cluster.
var testHop = func() *encap.Keyring {
	k, err := encap.NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{7}, encap.KeyLen)})
	if err != nil {
		panic(err)
	}
	return k
}()

// sealed returns h and payload sealed with testHop, as a cluster relay
// forwards it.
func sealed(t testing.TB, h encap.Header, payload string) []byte {
	t.Helper()
	return sealedWith(t, testHop, h, payload)
}

func udp4(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func startTiers(t *testing.T) *tiers {
	t.Helper()
	return startTiersBatch(t, 0, false)
}

// startTiersBatch is startTiers with both relays reading and writing up
// to batch datagrams per system call (0 or 1: one), and sending bundles
// when bundle is set.
func startTiersBatch(t testing.TB, batch int, bundle bool) *tiers {
	t.Helper()
	keys, err := token.NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{1}, token.KeyLen)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &tiers{grReg: prometheus.NewRegistry(), crReg: prometheus.NewRegistry(), podReg: prometheus.NewRegistry(), keys: keys}
	podConn, crConn, pub, in := udp4(t), udp4(t), udp4(t), udp4(t)
	m, err := newMetrics(tr.podReg)
	if err != nil {
		t.Fatal(err)
	}
	sock := newPodSocket(podConn, 7, 3, testHop, nil, m, time.Now)
	tr.sock = sock
	tr.vip = netip.MustParseAddrPort("127.0.0.2:3478")
	if tr.pc, _, err = sock.popConn(1, tr.vip); err != nil {
		t.Fatal(err)
	}
	if tr.ufrag, err = keys.Mint(7, 3); err != nil {
		t.Fatal(err)
	}
	sc, err := tr.pc.mux.GetConn(tr.ufrag, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.session = sc.(*muxConn)
	cr, err := clusterrelay.New(clusterrelay.Config{Cluster: 7, Hop: testHop, Registerer: tr.crReg, Logger: quiet, Tuning: udpio.Tuning{Batch: batch, Bundle: bundle},
		Pods: clusterrelay.NewPods(map[uint16]netip.AddrPort{3: podConn.LocalAddr().(*net.UDPAddr).AddrPort()})}, crConn)
	if err != nil {
		t.Fatal(err)
	}
	gr, err := globalrelay.New(globalrelay.Config{POP: 1, Keys: keys, Registerer: tr.grReg, Logger: quiet, Tuning: udpio.Tuning{Batch: batch, Bundle: bundle},
		Hop:       encap.NewClusterKeys(map[uint16]*encap.Keyring{7: testHop}),
		Directory: globalrelay.NewClusters([]globalrelay.Replica{{Cluster: 7, Addr: cr.Addr()}})},
		[]globalrelay.Worker{{Public: pub, Internal: in}})
	if err != nil {
		t.Fatal(err)
	}
	tr.pub = gr.PublicAddr()
	tr.gr, tr.cr = gr, cr
	tr.client = udp4(t)
	tr.clientAddr = tr.client.LocalAddr().(*net.UDPAddr).AddrPort()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	go func() { _ = gr.Run(ctx); done <- struct{}{} }()
	go func() { _ = cr.Run(ctx); done <- struct{}{} }()
	go func() { _ = sock.readLoop(sock.conn); done <- struct{}{} }()
	tr.stop = func() {
		cancel()
		podConn.Close()
		sock.closeAll()
		for range 3 {
			<-done
		}
		tr.client.Close()
	}
	t.Cleanup(tr.stop)
	return tr
}

// mapClient routes a client address to the tiers' session, as the POP's
// mux does after a check from it.
func (tr *tiers) mapClient(c netip.AddrPort) {
	m := tr.pc.mux
	m.mu.Lock()
	defer m.mu.Unlock()
	m.byAddr[c] = tr.session
	tr.session.addrs = append(tr.session.addrs, c)
}

// check sends a valid ICE check for the pod, which opens the flow, and
// waits for it at the pod.
func (tr *tiers) check(t testing.TB) {
	t.Helper()
	m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(tr.ufrag+":clnt"),
		stun.NewShortTermIntegrity("password-password-pass"), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.client.WriteToUDPAddrPort(m.Raw, tr.pub); err != nil {
		t.Fatal(err)
	}
	if got, ok := tr.readPod(t, 5*time.Second); !ok || !bytes.Equal(got, m.Raw) {
		t.Fatal("the check did not reach the pod")
	}
	tr.authenticated(tr.clientAddr)
}

// readPod returns the next client datagram the pod hands to WebRTC.
func (tr *tiers) readPod(t testing.TB, wait time.Duration) ([]byte, bool) {
	t.Helper()
	_ = tr.session.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	n, from, err := tr.session.ReadFromAddrPort(buf)
	if err != nil {
		return nil, false
	}
	if from != tr.clientAddr {
		t.Fatalf("pod saw the datagram from %v, want the client %v", from, tr.clientAddr)
	}
	return buf[:n], true
}

// metricValue reads a counter of a registry by its reason label.
func metricValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	return counter(t, reg, name, "reason", reason)
}

// TestDatagramSizeLimitAcrossTiers: one size limit for every tier. A
// datagram of at most encap.MaxPayload bytes crosses global relay, cluster
// relay and pod both ways; a longer one (2,000 bytes, which both relays used
// to forward and the pod dropped) is dropped and counted at the first tier
// it meets, in either direction, and nowhere else.
func TestDatagramSizeLimitAcrossTiers(t *testing.T) {
	tr := startTiers(t)
	tr.check(t)
	const drops = "_dropped_packets_total"
	for _, tc := range []struct {
		size int
		pass bool
	}{{1200, true}, {encap.MaxPayload, true}, {encap.MaxPayload + 1, false}, {2000, false}} {
		pkt := make([]byte, tc.size)
		pkt[0] = 0x80 // RTP
		pkt[tc.size-1] = 0x55
		grBefore := metricValue(t, tr.grReg, "rtcedge_globalrelay"+drops, "oversize")
		if _, err := tr.client.WriteToUDPAddrPort(pkt, tr.pub); err != nil {
			t.Fatal(err)
		}
		if tc.pass {
			if got, ok := tr.readPod(t, 5*time.Second); !ok || !bytes.Equal(got, pkt) {
				t.Fatalf("%d bytes: did not reach the pod intact", tc.size)
			}
			// And back: pod → cluster relay → global relay → client.
			if _, err := tr.pc.write(pkt, tr.clientAddr, "feed"); err != nil {
				t.Fatalf("%d bytes: pod write: %v", tc.size, err)
			}
			_ = tr.client.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 4096)
			n, _, err := tr.client.ReadFromUDPAddrPort(buf)
			if err != nil || !bytes.Equal(buf[:n], pkt) {
				t.Fatalf("%d bytes: reply did not reach the client intact (%v)", tc.size, err)
			}
			continue
		}
		eventually(t, "the global relay to count the oversize datagram", func() bool {
			return metricValue(t, tr.grReg, "rtcedge_globalrelay"+drops, "oversize") == grBefore+1
		})
		if _, err := tr.pc.write(pkt, tr.clientAddr, "feed"); err == nil {
			t.Errorf("%d bytes: the pod sent an oversize reply", tc.size)
		}
	}
	// Nothing oversize reached a later tier: they never saw one.
	if v := metricValue(t, tr.crReg, "rtcedge_clusterrelay"+drops, "oversize"); v != 0 {
		t.Errorf("cluster relay dropped %v oversize datagrams, want 0 (the global relay drops them first)", v)
	}
	if v := metricValue(t, tr.podReg, "rtcedge_transceiver"+drops, "oversize"); v != 2 {
		t.Errorf("pod counted %v oversize replies, want 2 (the two it refused to send)", v)
	}
	if got, ok := tr.readPod(t, 100*time.Millisecond); ok {
		t.Errorf("an oversize datagram reached the pod (%d bytes)", len(got))
	}
}

// TestHopKeyRotationWithoutRestart: keys rotate on running tiers in the
// documented three steps (add the new key everywhere, make it current
// everywhere, retire the old one) and a call's datagrams cross every tier
// in both directions after each step; after retirement, a datagram sealed
// with the old key is refused as unknown_key.
func TestHopKeyRotationWithoutRestart(t *testing.T) {
	tr := startTiers(t)
	tr.check(t)
	newKey := bytes.Repeat([]byte{0x77}, encap.KeyLen)
	oldKey := bytes.Repeat([]byte{7}, encap.KeyLen)
	ring := func(current uint8, keys map[uint8][]byte) *encap.Keyring {
		k, err := encap.NewKeyring(current, keys)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	set := func(k *encap.Keyring) {
		tr.gr.SetHopKeys(encap.NewClusterKeys(map[uint16]*encap.Keyring{7: k}))
		tr.cr.SetHopKeys(k)
		tr.sock.keys.Store(k)
	}
	roundTrip := func(step string) {
		t.Helper()
		pkt := []byte{0x80, 0, 1, 2, 3}
		if _, err := tr.client.WriteToUDPAddrPort(pkt, tr.pub); err != nil {
			t.Fatal(err)
		}
		if got, ok := tr.readPod(t, 5*time.Second); !ok || !bytes.Equal(got, pkt) {
			t.Fatalf("%s: uplink lost", step)
		}
		if _, err := tr.pc.write(pkt, tr.clientAddr, "feed"); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		_ = tr.client.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 100)
		if n, _, err := tr.client.ReadFromUDPAddrPort(buf); err != nil || !bytes.Equal(buf[:n], pkt) {
			t.Fatalf("%s: downlink lost (%v)", step, err)
		}
	}
	roundTrip("before")
	set(ring(1, map[uint8][]byte{1: oldKey, 2: newKey}))
	roundTrip("new key accepted")
	set(ring(2, map[uint8][]byte{1: oldKey, 2: newKey}))
	roundTrip("new key current")
	old := ring(1, map[uint8][]byte{1: oldKey})
	set(ring(2, map[uint8][]byte{2: newKey}))
	roundTrip("old key retired")
	// A sender still on the old key is refused by the cluster relay.
	stale := sealedWith(t, old, encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: tr.clientAddr, Ingress: tr.gr.IngressAddrs()[0]}, "stale")
	if _, err := tr.client.WriteToUDPAddrPort(stale, tr.cr.Addr()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stale datagram to be counted", func() bool {
		return metricValue(t, tr.crReg, "rtcedge_clusterrelay_dropped_packets_total", "encap_unknown_key") == 1
	})
}

func sealedWith(t testing.TB, k *encap.Keyring, h encap.Header, payload string) []byte {
	t.Helper()
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	hl := len(b)
	b = append(b, payload...)
	k.Seal(b, hl)
	return b
}

// authenticated does for a client address what Pion's check verification
// (confirm) and the answer to the pod's probe (reach.go) do: its route may
// carry DTLS and media.
func (tr *tiers) authenticated(c netip.AddrPort) {
	tr.sock.Confirm(1, c, "feed", [12]byte{1})
	tr.pc.prove(tr.pc.route(c), "feed")
}
