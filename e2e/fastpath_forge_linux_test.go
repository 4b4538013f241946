package e2e

// Forged tier datagrams against the fast path's site: an attacker host
// spoofing the relays' own addresses.

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
	"github.com/rtcedge/rtcedge/internal/proctest"
)

// attackerAddr is a host on the same LAN that holds no key: anyone who
// can spoof a source address (a compromised host of the data centre).
var attackerAddr = fptest.LANAddr(60)

// forgeries is how many of each forged datagram the attacker sends.
const forgeries = 20

// forge has the attacker send, while the call's flows are in the kernel,
// datagrams in the tiers' own format sealed with a key it made up, from
// the addresses the relays trust: toward the client into the global
// relay's ingress, as from the cluster relay, and toward the pod into the
// cluster relay, as from the global relay's ingress. None may be
// forwarded: each must reach user space and be dropped there as a bad
// MAC, exactly once, fast path on or off (with it on, the kernel passes
// each up under its tag verdict and forwards none of them).
func (s *site) forge() {
	t := s.t
	client := s.clientOutside()
	crData, err := netip.ParseAddrPort(s.crUp["data"])
	if err != nil {
		t.Fatalf("cluster relay data address %q: %v", s.crUp["data"], err)
	}
	ingress := netip.AddrPortFrom(grAddr, 3500)
	made := make([]byte, encap.KeyLen)
	_, _ = rand.Read(made)
	wrong, err := encap.NewKeyring(1, map[uint8][]byte{1: made})
	if err != nil {
		t.Fatal(err)
	}
	seal := func(h encap.Header) []byte {
		b, err := h.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		hl := len(b)
		b = append(b, append([]byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}, bytes.Repeat([]byte{0x5a}, 80)...)...)
		wrong.Seal(b, hl)
		return b
	}
	toClient := seal(encap.Header{ToClient: true, Cluster: 1, Pod: 1, POP: 1, Client: client, Ingress: ingress})
	toPod := seal(encap.Header{Cluster: 1, Pod: 1, POP: 1, Client: client, Ingress: ingress})

	const grDrops, crDrops = "rtcedge_globalrelay_dropped_packets_total", "rtcedge_clusterrelay_dropped_packets_total"
	const grVerdicts, crVerdicts = "rtcedge_globalrelay_fast_path_packets_total", "rtcedge_clusterrelay_fast_path_packets_total"
	mac, tag := `reason="encap_mac"`, `verdict="tag"`
	gr0, cr0 := s.metric(grAddr, grDrops, mac), s.metric(crAddr, crDrops, mac)
	grTag0, crTag0 := s.metric(grAddr, grVerdicts, tag), s.metric(crAddr, crVerdicts, tag)
	attacker := s.hosts["attacker"]
	for range forgeries {
		spoof(s, attacker, crData, ingress, toClient)
		spoof(s, attacker, ingress, crData, toPod)
	}
	// The relays add the kernel's counters to their metrics now and then
	// (the global relay at its expiry scans): await them.
	proctest.Await(t, 20*time.Second, "every forged datagram counted", func() bool {
		return s.metric(grAddr, grDrops, mac)-gr0 >= forgeries && s.metric(crAddr, crDrops, mac)-cr0 >= forgeries &&
			(s.mode == "off" || s.metric(grAddr, grVerdicts, tag)-grTag0 >= forgeries && s.metric(crAddr, crVerdicts, tag)-crTag0 >= forgeries)
	})
	got := []float64{s.metric(grAddr, grDrops, mac) - gr0, s.metric(crAddr, crDrops, mac) - cr0,
		s.metric(grAddr, grVerdicts, tag) - grTag0, s.metric(crAddr, crVerdicts, tag) - crTag0}
	want := []float64{forgeries, forgeries, forgeries, forgeries}
	if s.mode == "off" {
		want[2], want[3] = 0, 0
	}
	for i, what := range []string{"global relay bad-MAC drops", "cluster relay bad-MAC drops",
		"global relay kernel tag passes", "cluster relay kernel tag passes"} {
		if got[i] != want[i] {
			t.Errorf("%s: %v, want %v", what, got[i], want[i])
		}
	}
}

// spoof sends payload from src to dst, from the attacker's host with a
// forged source address (a raw IP socket).
func spoof(s *site, attacker *fptest.Net, src, dst netip.AddrPort, payload []byte) {
	if err := attacker.Spoof(src, dst, payload); err != nil {
		s.t.Fatal(err)
	}
}

// clientOutside is the client's current address outside its NAT, read
// from the NAT's connection tracking.
func (s *site) clientOutside() netip.AddrPort {
	s.t.Helper()
	out, err := exec.Command("ip", s.client.Exec("cat", "/proc/net/nf_conntrack")...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("conntrack: %v: %s", err, out)
	}
	// The reply tuple of the client's flow to the VIP names the mapping.
	re := regexp.MustCompile(fmt.Sprintf(`udp .*src=%s dst=%s sport=40000 dport=3478 .*src=%s dst=(\S+) sport=3478 dport=(\d+)`,
		regexp.QuoteMeta(clientAddr.String()), regexp.QuoteMeta(grAddr.String()), regexp.QuoteMeta(grAddr.String())))
	m := re.FindStringSubmatch(string(out))
	if m == nil {
		s.t.Fatalf("no NAT mapping of the client's flow in:\n%s", out)
	}
	a, err1 := netip.ParseAddr(m[1])
	p, err2 := strconv.Atoi(m[2])
	if err1 != nil || err2 != nil {
		s.t.Fatalf("mapping %q", m[0])
	}
	return netip.AddrPortFrom(a, uint16(p))
}
