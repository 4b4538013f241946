package globalrelay

// Tests of the relay's packet path: forwarding both ways, bad input
// dropped and counted, the return path's trust, the flow table's caps
// and expiry, drain, the directory, and the no-allocation guards.

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testKeys(t testing.TB) *token.Keyring {
	t.Helper()
	key := bytes.Repeat([]byte{7}, token.KeyLen)
	k, err := token.NewKeyring(1, map[uint8][]byte{1: key})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testHop holds the inter-tier key of cluster 0x12, the tests' cluster.
var testHop = func() *encap.ClusterKeys {
	k, err := encap.NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{0x12}, encap.KeyLen)})
	if err != nil {
		panic(err)
	}
	return encap.NewClusterKeys(map[uint16]*encap.Keyring{0x12: k})
}()

// seal returns h and payload as a datagram sealed with cluster 0x12's key,
// as a cluster relay would forward it.
func seal(t testing.TB, h encap.Header, payload []byte) []byte {
	t.Helper()
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	hl := len(b)
	b = append(b, payload...)
	testHop.For(0x12).Seal(b, hl)
	return b
}

func listen(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// newTestRelay builds a relay of POP 9 on fresh loopback sockets (pub,
// in). Unset Keys, Hop, Logger and Registerer take the tests' own; an
// unset Directory holds one cluster relay of cluster 0x12, at cluster.
func newTestRelay(tb testing.TB, cfg Config, cluster netip.AddrPort) (r *Relay, pub, in *net.UDPConn) {
	tb.Helper()
	cfg.POP = 9
	if cfg.Keys == nil {
		cfg.Keys = testKeys(tb)
	}
	if cfg.Hop == nil {
		cfg.Hop = testHop
	}
	if cfg.Directory == nil {
		cfg.Directory = NewClusters([]Replica{{Cluster: 0x12, Addr: cluster}})
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	pub, in = listen(tb), listen(tb)
	r, err := New(cfg, []Worker{{Public: pub, Internal: in}})
	if err != nil {
		tb.Fatal(err)
	}
	return r, pub, in
}

// bindingRequest builds an ICE connectivity check with USERNAME
// "<ufrag>:client".
func bindingRequest(t testing.TB, ufrag string) []byte {
	t.Helper()
	m, err := stun.Build(stun.TransactionID, stun.BindingRequest,
		stun.NewUsername(ufrag+":clnt"), stun.NewShortTermIntegrity("password-password-pass"), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	return m.Raw
}

// testNet is where a rig's sockets live: loopback, or two network
// namespaces joined by a veth pair with the relay's fast path attached
// (vethNet, fastpath_suite_linux_test.go), so that the same tests show the
// same behaviour with the datagrams forwarded by the kernel.
type testNet struct {
	peer  func(testing.TB) *net.UDPConn // a client's, a cluster relay's or an attacker's socket
	relay func(testing.TB) *net.UDPConn // one of the relay's own sockets
	in    func(func() error) error      // runs New where the relay's sockets are
	fast  fastpath.Mode
	// done, if set, checks the relay once the test is over, before it
	// stops (that the kernel took part).
	done func(*testing.T, *Relay)
}

// loopback is the testNet of the package's tests: every socket on
// 127.0.0.1, where the fast path never attaches.
var loopback = testNet{peer: listen, relay: listen, in: func(f func() error) error { return f() }, fast: fastpath.ModeOff}

type rig struct {
	net     testNet
	relay   *Relay
	reg     *prometheus.Registry
	cluster *net.UDPConn // plays the cluster relay
	client  *net.UDPConn
	keys    *token.Keyring
	pub     netip.AddrPort
	ingress netip.AddrPort
	cancel  context.CancelFunc
	done    chan error
}

func newRig(t *testing.T, cfg Config) *rig { t.Helper(); return newRigOn(t, loopback, cfg) }

// newRigOn is newRig with its sockets on n.
func newRigOn(t *testing.T, n testNet, cfg Config) *rig {
	t.Helper()
	r := &rig{net: n, reg: prometheus.NewRegistry(), cluster: n.peer(t), client: n.peer(t), keys: testKeys(t), done: make(chan error, 1)}
	cfg.POP, cfg.Keys, cfg.Logger, cfg.Registerer, cfg.FastPath = 9, r.keys, quiet, r.reg, n.fast
	if cfg.Hop == nil {
		cfg.Hop = testHop
	}
	if cfg.Directory == nil {
		cfg.Directory = NewClusters([]Replica{{Cluster: 0x12, Addr: addrOf(r.cluster)}})
	}
	pub, in := n.relay(t), n.relay(t)
	var relay *Relay
	err := n.in(func() (err error) {
		relay, err = New(cfg, []Worker{{Public: pub, Internal: in}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r.relay, r.pub, r.ingress = relay, addrOf(pub), addrOf(in)
	if cfg.EventLoop != nil && *cfg.EventLoop && !relay.io.EventLoop() {
		t.Fatal("event_loop set, but the worker has no event loop")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			t.Errorf("Run: %v", err)
		}
		r.cluster.Close()
		r.client.Close()
	})
	if n.done != nil {
		t.Cleanup(func() { n.done(t, relay) }) // before the relay stops
	}
	return r
}

// listen opens a peer's socket on the rig's network.
func (r *rig) listen(t testing.TB) *net.UDPConn { return r.net.peer(t) }

func (r *rig) validCheck(t *testing.T, pod uint16) []byte {
	ufrag, err := r.keys.Mint(0x12, pod)
	if err != nil {
		t.Fatal(err)
	}
	return bindingRequest(t, ufrag)
}

func read(t *testing.T, c *net.UDPConn) ([]byte, netip.AddrPort) {
	t.Helper()
	buf := make([]byte, 2048)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return buf[:n], from
}

func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabel(m, label, value) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, k, v string) bool {
	if k == "" {
		return true
	}
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// TestForwardingBothWays: a valid check creates a flow and reaches the
// cluster relay with the right header; the reply goes back to the client
// from the public address, bare.
func TestForwardingBothWays(t *testing.T) {
	for _, batch := range []int{0, 32} {
		t.Run("batch-"+strconv.Itoa(batch), func(t *testing.T) { testForwardingBothWays(t, Config{Tuning: udpio.Tuning{Batch: batch}}) })
	}
	// Pinned: both read loops on locked threads with CPU 0 as their only
	// CPU while they forward.
	t.Run("batch-32-pinned", func(t *testing.T) {
		testForwardingBothWays(t, Config{Tuning: udpio.Tuning{Batch: 32, CPUs: []int{0}}})
		if n := threadsOnlyOn(t, 0); n < 2 {
			t.Errorf("%d threads pinned to CPU 0, want the 2 read loops", n)
		}
	})
	// The event loop: both directions from one thread, pinned.
	t.Run("event-loop", func(t *testing.T) {
		testForwardingBothWays(t, Config{Tuning: udpio.Tuning{Batch: 32, EventLoop: new(true)}})
	})
	t.Run("event-loop-pinned", func(t *testing.T) {
		testForwardingBothWays(t, Config{Tuning: udpio.Tuning{Batch: 32, EventLoop: new(true), CPUs: []int{0}}})
		if n := threadsOnlyOn(t, 0); n < 1 {
			t.Errorf("%d threads pinned to CPU 0, want the event loop's", n)
		}
	})
}

// threadsOnlyOn counts this process's threads whose CPU mask is exactly
// {cpu}.
func threadsOnlyOn(t *testing.T, cpu int) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) == strconv.Itoa(cpu) {
				n++
			}
		}
	}
	return n
}

func testForwardingBothWays(t *testing.T, cfg Config) {
	r := newRig(t, cfg)
	check := r.validCheck(t, 0x42)
	if _, err := r.client.WriteToUDPAddrPort(check, r.pub); err != nil {
		t.Fatal(err)
	}
	got, _ := read(t, r.cluster)
	h, n, err := encap.Decode(got)
	if err != nil {
		t.Fatalf("decode forwarded header: %v", err)
	}
	if err := testHop.For(0x12).Verify(got, n); err != nil {
		t.Fatalf("forwarded datagram does not verify: %v", err)
	}
	want := encap.Header{KeyID: 1, Cluster: 0x12, Pod: 0x42, POP: 9, Token: h.Token, Client: addrOf(r.client), Ingress: r.ingress}
	if h != want || h.Token == ([6]byte{}) || !bytes.Equal(got[n:], check) {
		t.Fatalf("forwarded %+v + %d bytes, want %+v + the check unchanged", h, len(got)-n, want)
	}
	// Later non-STUN packets of the flow follow.
	dtls := []byte{22, 0xfe, 0xfd, 1, 2, 3}
	r.client.WriteToUDPAddrPort(dtls, r.pub)
	got, _ = read(t, r.cluster)
	if !bytes.Equal(got[n:], dtls) {
		t.Fatalf("DTLS of a known flow not forwarded unchanged")
	}
	// The reply.
	h.ToClient = true
	reply := seal(t, h, []byte("reply"))
	r.cluster.WriteToUDPAddrPort(reply, r.ingress)
	back, from := read(t, r.client)
	if string(back) != "reply" || from != r.pub {
		t.Fatalf("client got %q from %v, want \"reply\" from %v", back, from, r.pub)
	}
}

// TestBadInputDroppedAndCounted: garbage, forged tokens and stray replies
// are dropped, counted by reason, never answered and create no flow. Each
// bad datagram is followed by a good one on the same path; the good one
// arriving first proves the bad one went nowhere.
func TestBadInputDroppedAndCounted(t *testing.T) { testBadInputDroppedAndCounted(t, loopback) }

func testBadInputDroppedAndCounted(t *testing.T, n testNet) {
	r := newRigOn(t, n, Config{})
	forged := []byte("ExI0AEKhssPU5fbG74W9") // a well-formed token under another key
	badMAC := r.validCheck(t, 1)
	tests := []struct {
		name   string
		pkt    []byte
		reason string
	}{
		{"garbage", []byte("hello relay"), dropLabels[dropUnknownFlow]},
		{"DTLS from unknown", []byte{22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, dropLabels[dropUnknownFlow]},
		{"STUN without USERNAME", mustBuild(t, stun.BindingRequest), "stun_no_username"},
		{"STUN ufrag without colon", mustBuild(t, stun.BindingRequest, stun.NewUsername("abcdefghijklmnopqrst")), "stun_no_colon"},
		{"short ufrag", bindingRequest(t, "abcd"), "token_length"},
		{"bad alphabet", bindingRequest(t, "abcdefghij-klmnopqrs"), "token_alphabet"},
		{"unknown key", bindingRequest(t, string(forged)), "token_unknown_key"},
		{"forged MAC", corruptUfrag(t, badMAC), "token_mac"},
		{"empty", []byte{}, dropLabels[dropEmpty]},
	}
	for _, tt := range tests {
		good := r.validCheck(t, 7) // a fresh token each: one token opens at most maxFlowsPerToken flows
		t.Run(tt.name, func(t *testing.T) {
			attacker := r.listen(t)
			defer attacker.Close()
			before := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", tt.reason)
			attacker.WriteToUDPAddrPort(tt.pkt, r.pub)
			// Then a good check from the same socket: it creates the flow.
			attacker.WriteToUDPAddrPort(good, r.pub)
			got, _ := read(t, r.cluster)
			if _, n, err := encap.Decode(got); err != nil || !bytes.Equal(got[n:], good) {
				h, _, _ := encap.Decode(got)
				t.Fatalf("cluster relay saw something other than the good check first: %+v %q", h, got)
			}
			if after := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", tt.reason); after != before+1 {
				t.Errorf("drops{reason=%q} went %v → %v, want +1", tt.reason, before, after)
			}
			// Nothing came back to the attacker: the next thing it reads
			// is a reply we send through the flow now.
			h := encap.Header{ToClient: true, Cluster: 0x12, Pod: 7, POP: 9, Client: addrOf(attacker), Ingress: r.ingress}
			r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("x")), r.ingress)
			if back, _ := read(t, attacker); string(back) != "x" {
				t.Fatalf("attacker read %q first, want only our reply", back)
			}
		})
	}
}

// TestReturnPathTrust: a to-client datagram for an unknown client restores
// the flow only when it comes from a known cluster relay of its cluster.
func TestReturnPathTrust(t *testing.T) { testReturnPathTrust(t, loopback) }

func testReturnPathTrust(t *testing.T, n testNet) {
	r := newRigOn(t, n, Config{})
	victim := r.listen(t)
	defer victim.Close()
	stranger := r.listen(t)
	defer stranger.Close()
	h := encap.Header{ToClient: true, Cluster: 0x12, Pod: 3, POP: 9, Client: addrOf(victim), Ingress: r.ingress}
	pkt := seal(t, h, []byte("spoofed"))
	stranger.WriteToUDPAddrPort(pkt, r.ingress)
	// From the known cluster relay it is trusted and restores the flow,
	// which forwards replies once the client has spoken on it.
	r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("restored")), r.ingress)
	waitCounter(t, r.reg, "rtcedge_globalrelay_flows_restored_total", "source", "return_path", 1)
	victim.WriteToUDPAddrPort([]byte{0x80, 111, 0, 1}, r.pub)
	read(t, r.cluster) // the client's datagram found the restored flow
	r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("confirmed")), r.ingress)
	if back, _ := read(t, victim); string(back) != "confirmed" {
		t.Fatalf("victim got %q first: the stranger's datagram was reflected, or the reply before the client spoke", back)
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropNotFromCluster]); v != 1 {
		t.Errorf("not_from_cluster drops = %v, want 1", v)
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_flows_restored_total", "source", "return_path"); v != 1 {
		t.Errorf("flows restored from the return path = %v, want 1", v)
	}
	// Wrong direction and wrong POP on the internal socket are dropped.
	for _, bad := range []encap.Header{
		{ToClient: false, Cluster: 0x12, Pod: 3, POP: 9, Client: addrOf(victim), Ingress: r.ingress},
		{ToClient: true, Cluster: 0x12, Pod: 3, POP: 10, Client: addrOf(victim), Ingress: r.ingress},
		{ToClient: true, Cluster: 0x12, Pod: 4, POP: 9, Client: addrOf(victim), Ingress: r.ingress},
	} {
		r.cluster.WriteToUDPAddrPort(seal(t, bad, []byte("z")), r.ingress)
	}
	r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("ok")), r.ingress)
	if back, _ := read(t, victim); string(back) != "ok" {
		t.Fatalf("victim got %q, want only the good reply", back)
	}
	// With the fast path on, the good reply crosses the kernel and may
	// overtake the bad ones, which go up to user space: await their drops
	// (each dropped, so sent nowhere), then count them.
	for _, reason := range []string{dropLabels[dropWrongDirection], dropLabels[dropWrongPOP], dropLabels[dropFlowMismatch]} {
		waitCounter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", reason, 1)
		if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", reason); v != 1 {
			t.Errorf("drops{reason=%q} = %v, want 1", reason, v)
		}
	}
}

// TestFlowExpiryAndCap: idle flows expire; a full table refuses new flows
// and counts it.
func TestFlowExpiryAndCap(t *testing.T) {
	r := newRig(t, Config{FlowIdle: 300 * time.Millisecond, MaxFlows: 1})
	r.client.WriteToUDPAddrPort(r.validCheck(t, 1), r.pub)
	read(t, r.cluster)
	other := listen(t)
	defer other.Close()
	other.WriteToUDPAddrPort(r.validCheck(t, 2), r.pub)
	r.client.WriteToUDPAddrPort([]byte{22, 0xfe, 0xfd, 9}, r.pub) // still forwarded: known flow
	got, _ := read(t, r.cluster)
	if _, n, _ := encap.Decode(got); !bytes.Equal(got[n:], []byte{22, 0xfe, 0xfd, 9}) {
		t.Fatal("second client's check was forwarded although the table is full")
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropTableFull]); v != 1 {
		t.Errorf("table_full drops = %v, want 1", v)
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.relay.Flows() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("idle flow did not expire")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHotPathAllocations: forwarding a known flow's packet, and creating a
// flow from a valid check's token, allocate nothing per packet (flow
// creation allocates the flow itself, once).
func TestHotPathAllocations(t *testing.T) {
	reg := prometheus.NewRegistry()
	cl := NewClusters([]Replica{{Cluster: 0x12, Addr: netip.MustParseAddrPort("127.0.0.1:9")}})
	relay, _, _ := newTestRelay(t, Config{Directory: cl, Registerer: reg}, netip.AddrPort{})
	defer relay.Close()
	ufrag, _ := relay.cfg.Keys.Mint(0x12, 1)
	check := bindingRequest(t, ufrag)
	client := netip.MustParseAddrPort("192.0.2.1:5000")
	buf := make([]byte, encap.MaxLen+2048)
	ingress := netip.MustParseAddrPort("127.0.0.1:7")
	copy(buf[encap.MaxLen:], check)
	if _, _, ok := relay.fromClient(buf, len(check), client, ingress); !ok {
		t.Fatal("valid check not forwarded")
	}
	media := []byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 9, 9, 9, 9}
	for _, tc := range []struct {
		name string
		pkt  []byte
	}{{"media", media}, {"consent check", check}} {
		allocs := testing.AllocsPerRun(1000, func() {
			copy(buf[encap.MaxLen:], tc.pkt)
			relay.fromClient(buf, len(tc.pkt), client, ingress)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per packet, want 0", tc.name, allocs)
		}
	}
	h := encap.Header{ToClient: true, Cluster: 0x12, Pod: 1, POP: 9, Client: client, Ingress: ingress}
	reply := seal(t, h, media)
	if allocs := testing.AllocsPerRun(1000, func() {
		relay.toClient(reply, len(reply), netip.MustParseAddrPort("127.0.0.1:9"))
	}); allocs != 0 {
		t.Errorf("reply: %v allocations per packet, want 0", allocs)
	}
}

func mustBuild(t *testing.T, setters ...stun.Setter) []byte {
	t.Helper()
	m, err := stun.Build(append([]stun.Setter{stun.TransactionID}, setters...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m.Raw
}

// corruptUfrag flips a bit of the MAC part of a check's ufrag, keeping it
// base64 (and re-computing nothing: the relay checks only the token).
func corruptUfrag(t *testing.T, check []byte) []byte {
	t.Helper()
	out := bytes.Clone(check)
	// The USERNAME's colon, not a ':' byte of the random transaction ID.
	i := bytes.Index(out, []byte(":clnt"))
	if i < 2 {
		t.Fatal("no colon in check")
	}
	c := out[i-1]
	if c == 'A' {
		out[i-1] = 'B'
	} else {
		out[i-1] = 'A'
	}
	return out
}

// TestDrain: a draining replica refuses new flows and keeps forwarding the
// ones it has.
func TestDrain(t *testing.T) {
	r := newRig(t, Config{})
	r.client.WriteToUDPAddrPort(r.validCheck(t, 1), r.pub)
	read(t, r.cluster)
	r.relay.Drain()
	newcomer := listen(t)
	defer newcomer.Close()
	newcomer.WriteToUDPAddrPort(r.validCheck(t, 2), r.pub)
	media := []byte{0x80, 111, 0, 2}
	r.client.WriteToUDPAddrPort(media, r.pub)
	got, _ := read(t, r.cluster)
	if _, n, _ := encap.Decode(got); !bytes.Equal(got[n:], media) {
		t.Fatal("first datagram through a draining relay was not the existing flow's")
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropDraining]); v != 1 {
		t.Errorf("draining drops = %v, want 1", v)
	}
}

// TestTokenFlowCap: one token opens flows from at most maxFlowsPerToken
// addresses; further addresses are refused and counted, and the share is
// given back when flows expire.
func TestTokenFlowCap(t *testing.T) {
	r := newRig(t, Config{FlowIdle: 300 * time.Millisecond})
	check := r.validCheck(t, 1)
	var socks []*net.UDPConn
	for range maxFlowsPerToken + 1 {
		c := listen(t)
		defer c.Close()
		socks = append(socks, c)
	}
	for _, c := range socks[:maxFlowsPerToken] {
		c.WriteToUDPAddrPort(check, r.pub)
		read(t, r.cluster)
	}
	// The next address with the same token is refused; a fresh token from
	// it is fine, which shows the refusal was about the token.
	socks[maxFlowsPerToken].WriteToUDPAddrPort(check, r.pub)
	fresh := r.validCheck(t, 2)
	socks[maxFlowsPerToken].WriteToUDPAddrPort(fresh, r.pub)
	got, _ := read(t, r.cluster)
	if _, n, _ := encap.Decode(got); !bytes.Equal(got[n:], fresh) {
		t.Fatal("the reused token's check got through")
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropTokenReuse]); v != 1 {
		t.Errorf("token_reuse drops = %v, want 1", v)
	}
}

// TestCacheRefresh: a live flow is written to the route cache again every
// CacheRefresh, so the entry outlives the cache's TTL for a long call.
func TestCacheRefresh(t *testing.T) {
	store := routecache.NewMemoryStore()
	cache, err := routecache.NewMemoryOn(store, routecache.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cache.Run(ctx) }()
	defer func() { cancel(); <-done; cache.Close() }()
	r := newRig(t, Config{Cache: cache, CacheRefresh: 300 * time.Millisecond})
	r.client.WriteToUDPAddrPort(r.validCheck(t, 1), r.pub)
	read(t, r.cluster)
	client := addrOf(r.client)
	// expiry is when the entry would expire; a refresh moves it later.
	expiry := func() (time.Time, bool) {
		now := time.Now()
		ttl, ok := store.TTL(client, now)
		return now.Add(ttl), ok
	}
	first, ok := expiry()
	deadline := time.Now().Add(5 * time.Second)
	for !ok && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		first, ok = expiry()
	}
	if !ok {
		t.Fatal("the new flow was not stored")
	}
	// Keep the flow alive; its entry must be written again.
	for time.Now().Before(deadline) {
		r.client.WriteToUDPAddrPort([]byte{0x80, 111, 0, 1}, r.pub)
		read(t, r.cluster)
		if e, ok := expiry(); ok && e.Sub(first) > 200*time.Millisecond {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("a live flow's cache entry was never refreshed (cache stats %+v)", cache.Stats())
}

func TestClustersDirectory(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:1")
	b := netip.MustParseAddrPort("127.0.0.1:2")
	client := netip.MustParseAddrPort("192.0.2.1:1")
	c := NewClusters([]Replica{{Cluster: 1, Addr: a}, {Cluster: 1, Addr: b}})
	gen := c.Generation()
	c.Set([]Replica{{Cluster: 1, Addr: b}, {Cluster: 1, Addr: a}})
	if c.Generation() != gen {
		t.Error("the same replicas in another order changed the generation")
	}
	c.Set([]Replica{{Cluster: 1, Addr: a, Draining: true}, {Cluster: 1, Addr: b}})
	if got, _ := c.RelayFor(1, client); got != b {
		t.Errorf("with a draining, got %v, want b", got)
	}
	c.Set([]Replica{{Cluster: 1, Addr: a, Draining: true}})
	if got, ok := c.RelayFor(1, client); !ok || got != a {
		t.Errorf("with every replica draining, got %v %v, want the draining one", got, ok)
	}
	if _, ok := c.RelayFor(2, client); ok {
		t.Error("a relay for an unknown cluster")
	}
}

// TestFirstPacketAllocations: the first-packet path (a check from a new
// client: one STUN parse, token check, flow creation) allocates only the
// flow and its cached relay choice; a refused first packet (bad token,
// malformed STUN) allocates nothing.
func TestFirstPacketAllocations(t *testing.T) {
	cl := NewClusters([]Replica{{Cluster: 0x12, Addr: netip.MustParseAddrPort("127.0.0.1:9")}})
	relay, _, _ := newTestRelay(t, Config{Directory: cl, MaxFlows: 1 << 20}, netip.AddrPort{})
	defer relay.Close()
	ingress := netip.MustParseAddrPort("127.0.0.1:7")
	buf := make([]byte, encap.MaxLen+encap.MaxPayload)
	port := uint16(1)
	next := func() netip.AddrPort {
		port++
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(port >> 8)}), port)
	}
	// Each run needs its own token (a token opens at most
	// maxFlowsPerToken flows), minted outside the measured function.
	const runs = 200
	checks := make([][]byte, runs+1)
	for i := range checks {
		ufrag, _ := relay.cfg.Keys.Mint(0x12, 1)
		checks[i] = bindingRequest(t, ufrag)
	}
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		c := checks[i]
		i++
		copy(buf[encap.MaxLen:], c)
		if _, _, ok := relay.fromClient(buf, len(c), next(), ingress); !ok {
			t.Fatal("valid first check not forwarded")
		}
	})
	// The flow, its relay choice; the token count map and the shard map
	// grow now and then (amortised below one).
	if allocs > 3 {
		t.Errorf("first packet of a flow: %v allocations, want at most 3 (flow, relay choice, map growth)", allocs)
	}
	bad := corruptUfrag(t, checks[0])
	malformed := bytes.Clone(checks[0])
	malformed[len(malformed)-1] ^= 0xff // FINGERPRINT value: still STUN, the relay does not check it
	malformed[3] += 4                   // length field past the end
	for _, tc := range []struct {
		name string
		pkt  []byte
	}{{"bad token", bad}, {"malformed", malformed}} {
		if a := testing.AllocsPerRun(200, func() {
			copy(buf[encap.MaxLen:], tc.pkt)
			relay.fromClient(buf, len(tc.pkt), next(), ingress)
		}); a != 0 {
			t.Errorf("refused first packet (%s): %v allocations, want 0", tc.name, a)
		}
	}
}

// TestReturnPathRestoreSendsNothing: a compromised pod holds its cluster's
// hop key, so the headers of its replies can name any client address and
// any token. A flow it restores that way forwards nothing until the
// client itself sends on it, restored flows no client confirms expire
// within seconds, and restores are rate-limited: the pod can neither spray
// arbitrary addresses from the POP's public address nor fill the table
// other clusters' calls need.
func TestReturnPathRestoreSendsNothing(t *testing.T) {
	now := time.Now()
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	r := newRig(t, Config{MaxFlows: 160, Now: func() time.Time { return *clock.Load() }})
	victim := listen(t)
	defer victim.Close()
	for i := range 40 {
		h := encap.Header{ToClient: true, Cluster: 0x12, Pod: 3, POP: 9, Token: [6]byte{byte(i), 1}, Client: addrOf(victim), Ingress: r.ingress}
		// The first is the victim's own address; the others count away
		// from it without wrapping to port 0, which the relay refuses as
		// a source (dropped as bad_source, not restore_limit: a flake
		// for victim ports above 65495).
		port := h.Client.Port() + uint16(i)
		if h.Client.Port() > 65535-40 {
			port = h.Client.Port() - uint16(i)
		}
		h.Client = netip.AddrPortFrom(h.Client.Addr(), port)
		r.cluster.WriteToUDPAddrPort(seal(t, h, bytes.Repeat([]byte{0xAA}, 1000)), r.ingress)
	}
	// The replies and the client's datagrams arrive on different sockets:
	// wait until the relay has taken all 40.
	waitCounter(t, r.reg, "rtcedge_globalrelay_flows_restored_total", "source", "return_path", 20)
	waitCounter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropRestoreLimit], 20)
	// The victim's address is among them: its next datagram confirms that
	// flow, and only replies after that reach it.
	victim.WriteToUDPAddrPort([]byte{0x80, 111, 0, 1}, r.pub)
	read(t, r.cluster)
	h := encap.Header{ToClient: true, Cluster: 0x12, Pod: 3, POP: 9, Token: [6]byte{0, 1}, Client: addrOf(victim), Ingress: r.ingress}
	r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("after")), r.ingress)
	if back, _ := read(t, victim); string(back) != "after" {
		t.Fatalf("victim got %d bytes %.8q: a reply for a flow the client had not confirmed was forwarded", len(back), back)
	}
	// 160/8 = 20 restores a second: the other 20 were refused.
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropRestoreLimit]); v != 20 {
		t.Errorf("restore_limit drops = %v, want 20", v)
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", dropLabels[dropUnconfirmed]); v != 0 {
		t.Errorf("unconfirmed drops = %v before any reply to an unconfirmed flow", v)
	}
	if n := r.relay.Flows(); n != 20 {
		t.Errorf("%d flows, want the 20 restored", n)
	}
	later := now.Add(unconfirmedTTL + time.Second)
	clock.Store(&later)
	r.relay.expire()
	if n := r.relay.Flows(); n != 1 {
		t.Errorf("%d flows after the unconfirmed ones' lifetime, want the victim's confirmed one", n)
	}
}

// waitCounter waits until a counter reaches want (the relay's loops run on
// their own goroutines), failing after 5 s.
func waitCounter(t *testing.T, reg *prometheus.Registry, name, label, value string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, reg, name, label, value) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s{%s=%q} = %v after 5 s, want %v", name, label, value, counter(t, reg, name, label, value), want)
		}
		time.Sleep(time.Millisecond)
	}
}
