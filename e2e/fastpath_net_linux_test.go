package e2e

// The in-kernel fast path's end-to-end site (docs/fastpath.md): every role
// of rtcedge as its own process, each on its own host — a network
// namespace joined to one Ethernet bridge by a veth pair
// (internal/fastpath/fptest.LAN) — and a client host behind a kernel NAT.
// The tests need root (namespaces, BPF), iproute2, ethtool and nftables:
// they skip saying so without root and fail naming what to install
// otherwise.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
	"github.com/rtcedge/rtcedge/internal/proctest"
)

// The hosts' addresses on the LAN.
var (
	grAddr      = fptest.LANAddr(10)
	crAddr      = fptest.LANAddr(20)
	podAddr     = fptest.LANAddr(30)
	sigAddr     = fptest.LANAddr(40)
	clientAddr  = fptest.LANAddr(50)
	clientAddr2 = fptest.LANAddr(51) // the client's NAT's second outside address
)

// site is the running system: one host per role, the client's host, the
// role processes and an HTTP client that dials from the client's host.
type site struct {
	t        *testing.T
	mode     string // the relays' fast_path
	bin, dir string
	env      []string
	gr, cr   *fptest.Net
	client   *fptest.Net
	hosts    map[string]*fptest.Net
	procs    map[string]*proctest.Proc
	crUp     proctest.Fields
	grConfig string
	http     *http.Client
	natGen   int
}

// newSite starts every role on its own host of a new LAN, the relays with
// fast_path mode, and waits until signaling sees the cluster healthy.
func newSite(t *testing.T, mode string) *site {
	t.Helper()
	lan := fptest.NewLAN(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("the fast path's end-to-end test needs nft: apt-get install nftables")
	}
	s := &site{t: t, mode: mode, bin: proctest.Build(t, "github.com/rtcedge/rtcedge/cmd/rtcedge"), dir: t.TempDir(),
		hosts: map[string]*fptest.Net{}, procs: map[string]*proctest.Proc{}}
	for name, a := range map[string]netip.Addr{"gr": grAddr, "cr": crAddr, "pod": podAddr, "sig": sigAddr, "client": clientAddr,
		"attacker": attackerAddr} {
		s.hosts[name] = lan.Host(t, a)
	}
	s.gr, s.cr, s.client = s.hosts["gr"], s.hosts["cr"], s.hosts["client"]
	key, hop := make([]byte, 32), make([]byte, 16)
	_, _ = rand.Read(key)
	_, _ = rand.Read(hop)
	s.env = []string{"RTCEDGE_TOKEN_KEYS=1:" + base64.StdEncoding.EncodeToString(key),
		"RTCEDGE_HOP_KEYS=1/1:" + base64.StdEncoding.EncodeToString(hop)}
	s.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := s.client.In(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
	s.start()
	return s
}

// gossip is a role's gossip config: on its host, joining join.
func gossip(name string, a netip.Addr, join string) string {
	s := "  name: " + name + "\n  bind: " + a.String() + ":0\n  insecure: true\n  fast: true\n"
	if join != "" {
		s += "  join: [" + join + "]\n"
	}
	return s
}

// role starts the binary as role on host, with config.
func (s *site) role(host, role, config string) *proctest.Proc {
	s.t.Helper()
	file := proctest.WriteFile(s.t, s.dir, role+".yaml", config)
	argv := s.hosts[host].Exec(s.bin, role, "-config", file)
	p := proctest.Start(s.t, "ip", proctest.Spec{Name: role, Args: argv, Env: s.env})
	s.procs[role] = p
	return p
}

// start starts the roles in dependency order.
func (s *site) start() {
	t := s.t
	const limit = 30 * time.Second
	podUp := s.role("pod", "transceiver", fmt.Sprintf("region: eu-central\ncluster: 1\npod: 1\ndata_addr: %[1]s:0\napi_addr: %[1]s:0\n"+
		"metrics_addr: %[1]s:9090\ngossip:\n%[2]s", podAddr, gossip("pod-1", podAddr, ""))).WaitLog(t, "transceiver up", limit)
	s.crUp = s.role("cr", "clusterrelay", fmt.Sprintf("region: eu-central\ncluster: 1\ndata_addr: %[1]s:0\napi_addr: %[1]s:0\n"+
		"metrics_addr: %[1]s:9090\nfast_path: %[2]s\ncluster_gossip:\n%[3]sglobal_gossip:\n%[4]s",
		crAddr, s.mode, gossip("cr-1", crAddr, podUp["gossip"]), gossip("cr-1", crAddr, ""))).WaitLog(t, "cluster relay up", limit)
	// Fixed ports, as deploy/examples has them: a restarted replica is
	// found again on the same addresses.
	s.grConfig = fmt.Sprintf("region: eu-central\npop: 1\nclusters: [1]\npublic_addr: %[1]s:3478\ninternal_addr: %[1]s:3500\n"+
		"workers: 1\ndrain_timeout: 2s\nmetrics_addr: %[1]s:9090\nfast_path: %[2]s\ngossip:\n%[3]s",
		grAddr, s.mode, gossip("gr-1", grAddr, s.crUp["global_gossip"]))
	s.role("gr", "globalrelay", s.grConfig).WaitLog(t, "global relay up", limit)
	catalogue := proctest.WriteFile(t, s.dir, "catalogue.yaml", fmt.Sprintf(
		"default_region: eu-central\nregions:\n  - name: eu-central\n    location: {lat: 50.11, lon: 8.68}\n"+
			"    clusters:\n      - {id: 1, name: eu-central-1, session_api: %q}\n"+
			"    pops:\n      - {id: 1, name: fra, vip: \"%s:3478\"}\n", s.crUp["api"], grAddr))
	s.role("sig", "signaling", fmt.Sprintf("listen_addr: %s:8080\ndrain_delay: 200ms\ncatalogue: %s\nallow_anonymous: true\ndemo_page: true\n"+
		"gossip:\n%s", sigAddr, catalogue, gossip("sig-1", sigAddr, s.crUp["global_gossip"]))).WaitLog(t, "signaling up", limit)
	proctest.Await(t, limit, "signaling to see cluster 1 healthy and the POP up", func() bool {
		body, err := s.get(fmt.Sprintf("http://%s:8080/v1/regions", sigAddr))
		return err == nil && strings.Contains(body, `"known":true,"healthy":true`) && strings.Contains(body, `"up":true`)
	})
}

// restartGR kills the global relay without a goodbye, as a crash does,
// and starts a new one with the same config on the same host.
func (s *site) restartGR() {
	s.t.Helper()
	old := s.procs["globalrelay"]
	if err := old.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-old.Done():
	case <-time.After(10 * time.Second):
		s.t.Fatal("the killed global relay did not exit")
	}
	s.role("gr", "globalrelay", s.grConfig).WaitLog(s.t, "global relay up", 30*time.Second)
}

// get fetches url from the client's host.
func (s *site) get(url string) (string, error) {
	resp, err := s.http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b.String(), sc.Err()
}

// metric sums the series of name on the role's host whose labels include
// every label given ("verdict=\"forward_up\"").
func (s *site) metric(host netip.Addr, name string, labels ...string) float64 {
	s.t.Helper()
	body, err := s.get(fmt.Sprintf("http://%s:9090/metrics", host))
	if err != nil {
		s.t.Fatalf("metrics of %v: %v", host, err)
	}
	var sum float64
	for line := range strings.Lines(body) {
		series, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(series, "#") || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(series, l)
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil && match {
			sum += v
		}
	}
	return sum
}

// rebind moves the client's UDP mapping to a new outside port on ip (a
// kernel NAT in the client's host, nftables SNAT, a conntrack zone and a
// port range per generation): the client's socket stays the same, its
// datagrams leave from a new address, and replies to the old one find no
// mapping, as behind a home router that dropped its mappings.
func (s *site) rebind(ip netip.Addr) {
	s.t.Helper()
	s.natGen++
	if ip != clientAddr {
		s.ip("-n", s.client.Name(), "addr", "add", ip.String()+"/24", "dev", "eth0")
	}
	lo := 20000 + 1000*(s.natGen-1)
	flush := ""
	if s.natGen > 1 {
		flush = "flush table ip fp_nat\n"
	}
	cmd := exec.Command("ip", s.client.Exec("nft", "-f", "-")...)
	cmd.Stdin = strings.NewReader(fmt.Sprintf(`table ip fp_nat {}
%stable ip fp_nat {
	chain raw_out { type filter hook output priority raw; policy accept; meta l4proto udp ct zone set %[2]d; }
	chain raw_pre { type filter hook prerouting priority raw; policy accept; meta l4proto udp ct zone set %[2]d; }
	chain post { type nat hook postrouting priority srcnat; policy accept; oifname "eth0" meta l4proto udp counter snat to %[3]s:%[4]d-%[5]d; }
}
`, flush, s.natGen, ip, lo, lo+999))
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("nft: %v\n%s", err, out)
	}
}

func (s *site) ip(args ...string) {
	s.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		s.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
