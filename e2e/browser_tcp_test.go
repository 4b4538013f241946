package e2e

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rtcedge/rtcedge/devworld"
)

// udpBlockedNet is a network namespace joined to the root namespace by a
// veth pair, both ends the test's own hosts: the root side holds the POP
// and signaling addresses (two of a /29 in 10.200.0.0/16), the namespace
// side the client's. An nftables ruleset in the namespace can drop every
// UDP datagram, as a corporate firewall does.
type udpBlockedNet struct {
	t              *testing.T
	ns             string
	root, root2    netip.Addr // root-side addresses (POP 1 + signaling, POP 2)
	client         netip.Addr
	vethRoot, peer string
}

// requireTool fails (never skips) when a command is missing.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: install %s (scripts/test-deps.sh does)", name, pkg)
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newUDPBlockedNet creates the namespace and the veth pair; the test's
// cleanup deletes both whatever happens.
func newUDPBlockedNet(t *testing.T) *udpBlockedNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the UDP-blocked browser test creates a network namespace: run it as root")
	}
	ip := requireTool(t, "ip", "iproute2")
	requireTool(t, "nft", "nftables")
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	id := binary.BigEndian.Uint32(rnd[:])
	// A /29 of 10.200.0.0/16 that no interface uses yet.
	used := run(t, ip, "-4", "-o", "addr", "show")
	var sub int
	for i := 0; ; i++ {
		sub = int((id + uint32(i)*7919) % 8192) // 8192 /29s in a /16
		if !strings.Contains(used, fmt.Sprintf(" 10.200.%d.%d/", sub>>5, (sub&31)<<3|1)) {
			break
		}
		if i > 100 {
			t.Fatal("no free /29 in 10.200.0.0/16")
		}
	}
	base := [4]byte{10, 200, byte(sub >> 5), byte((sub & 31) << 3)}
	at := func(host byte) netip.Addr { b := base; b[3] |= host; return netip.AddrFrom4(b) }
	n := &udpBlockedNet{t: t, ns: fmt.Sprintf("rtcedge-tcp-%08x", id),
		root: at(1), root2: at(2), client: at(6),
		vethRoot: fmt.Sprintf("rt%08xa", id), peer: fmt.Sprintf("rt%08xb", id)}
	t.Cleanup(func() {
		// Deleting the namespace deletes its end of the pair, and so the
		// pair; the explicit delete covers a failure before the move.
		_ = exec.Command(ip, "netns", "del", n.ns).Run()
		_ = exec.Command(ip, "link", "del", n.vethRoot).Run()
	})
	run(t, ip, "netns", "add", n.ns)
	run(t, ip, "link", "add", n.vethRoot, "type", "veth", "peer", "name", n.peer)
	run(t, ip, "link", "set", n.peer, "netns", n.ns)
	run(t, ip, "addr", "add", n.root.String()+"/29", "dev", n.vethRoot)
	run(t, ip, "addr", "add", n.root2.String()+"/29", "dev", n.vethRoot)
	run(t, ip, "link", "set", n.vethRoot, "up")
	run(t, ip, "netns", "exec", n.ns, ip, "addr", "add", n.client.String()+"/29", "dev", n.peer)
	run(t, ip, "netns", "exec", n.ns, ip, "link", "set", n.peer, "up")
	run(t, ip, "netns", "exec", n.ns, ip, "link", "set", "lo", "up")
	return n
}

// blockUDP loads the ruleset that drops every UDP datagram in and out of
// the namespace.
func (n *udpBlockedNet) blockUDP() {
	n.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(`table inet rtcedge_udp_block {
	chain output { type filter hook output priority 0; policy accept; meta l4proto udp counter drop; }
	chain input { type filter hook input priority 0; policy accept; meta l4proto udp counter drop; }
}
`)
	if out, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("nft: %v\n%s", err, out)
	}
}

// blackholeTCP drops every TCP segment to and from ap in the namespace,
// silently, as a path through a dead router or a vanished host does (no
// reset, no ICMP).
func (n *udpBlockedNet) blackholeTCP(ap netip.AddrPort) {
	n.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(fmt.Sprintf(`table inet rtcedge_tcp_blackhole {
	chain output { type filter hook output priority 0; policy accept; ip daddr %[1]s tcp dport %[2]d drop; }
	chain input { type filter hook input priority 0; policy accept; ip saddr %[1]s tcp sport %[2]d drop; }
}
`, ap.Addr(), ap.Port()))
	if out, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("nft: %v\n%s", err, out)
	}
}

// droppedUDP returns how many UDP datagrams the ruleset dropped leaving
// the namespace.
func (n *udpBlockedNet) droppedUDP() int {
	n.t.Helper()
	out := run(n.t, "ip", "netns", "exec", n.ns, "nft", "list", "chain", "inet", "rtcedge_udp_block", "output")
	f := strings.Fields(out[strings.Index(out, "counter packets"):])
	v, err := strconv.Atoi(f[2])
	if err != nil {
		n.t.Fatalf("parse nft counter: %q", out)
	}
	return v
}

// inNamespace makes chromedp start Chromium inside the namespace (ip netns
// exec keeps the DevTools pipe's file descriptors).
func (n *udpBlockedNet) inNamespace() chromedp.ExecAllocatorOption {
	ip, _ := exec.LookPath("ip")
	return chromedp.ModifyCmdFunc(func(cmd *exec.Cmd) {
		cmd.Args = append([]string{ip, "netns", "exec", n.ns, cmd.Path}, cmd.Args[1:]...)
		cmd.Path = ip
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	})
}

// startWorld starts the dev world with its two POPs and signaling on the
// root side of the pair.
func (n *udpBlockedNet) startWorld(t *testing.T, extra ...func(*devworld.Config)) *devworld.World {
	t.Helper()
	regions := append([]devworld.RegionSpec(nil), devworld.DefaultRegions...)
	regions[0].POPIP, regions[1].POPIP = n.root, n.root2
	cfg := devworld.Config{Regions: regions, HTTPAddr: netip.AddrPortFrom(n.root, 0).String()}
	for _, f := range extra {
		f(&cfg)
	}
	return startWorld(t, cfg)
}

// startBrowser starts Chromium inside the namespace, allowed to reach the
// world's addresses.
func (n *udpBlockedNet) startBrowser(t *testing.T, w *devworld.World, extra ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	opts := append([]chromedp.ExecAllocatorOption{n.inNamespace(),
		// Chromium opens ICE-TCP connections through its network service,
		// which applies the resolver rules to IP literals too (UDP sockets
		// bypass them): every POP's address must be excluded, or the
		// connection to that POP fails at once with ERR_NAME_NOT_RESOLVED
		// and the browser has no pair for its TCP candidate.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE "+n.root.String()+", EXCLUDE "+n.root2.String()),
		// The page is not on localhost: let it use the microphone anyway.
		chromedp.Flag("unsafely-treat-insecure-origin-as-secure", w.SignalingURL)}, extra...)
	return startBrowser(t, opts...)
}

// browserCall clicks Call on the demo page, waits for connected audio with
// energy and an answered event, and hangs up. It returns the click →
// connected time the page measured, its signaling time and the remote
// address of the selected pair.
func browserCall(t *testing.T, b *browser, w *devworld.World) (connectedMs, signalingMs float64, remote string) {
	t.Helper()
	b.do("open the demo page", chromedp.Navigate(w.SignalingURL+"/"), chromedp.WaitVisible(chromedp.ID("call")))
	b.do("click Call", chromedp.Click(chromedp.ID("call")))
	b.waitJS("the call to connect", `(() => {
  const r = window.rtcedge;
  if (r.state === "connected") return "ok";
  if (r.state === "failed") return "the page reports: " + JSON.stringify(r.lastError);
  return "wait";
})()`, 30*time.Second)
	connectedMs = mustEval[float64](b, `window.rtcedge.timings.clickToConnectedMs`)
	signalingMs = mustEval[float64](b, `window.rtcedge.timings.signalingMs`)
	st := b.waitAudio("window.rtcedge.pc", 50, 20*time.Second)
	b.waitJS("the Send button", `document.getElementById("send").disabled ? "wait" : "ok"`, 10*time.Second)
	b.do("send a test event", chromedp.Click(chromedp.ID("send")))
	b.waitJS("the echo event", `window.rtcedge.events.some((e) => e.dir === "in" && JSON.parse(e.data).type === "rtcedge.echo") ? "ok" : "wait"`, 10*time.Second)
	before := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"reason": "deleted"})
	b.do("click Hang up", chromedp.Click(chromedp.ID("hangup")))
	b.waitJS("the page to end the call", `window.rtcedge.state === "ended" ? "ok" : "wait"`, 10*time.Second)
	eventually(t, 5*time.Second, "the session to end by DELETE", func() bool {
		return metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"reason": "deleted"}) == before+1
	})
	eventually(t, 5*time.Second, "no sessions", func() bool { return w.Sessions() == 0 })
	return connectedMs, signalingMs, st.Remote
}

// TestBrowserOverTCPWithUDPBlocked: Chromium in a network namespace whose
// firewall drops all UDP calls the dev world (outside, over a veth pair):
// ICE-TCP to the nearest POP's TCP port carries the call through both
// relay tiers, the beep echoes, the data channel answers, Hang up (DELETE)
// ends it. The same browser first calls with UDP allowed, as the same-run
// baseline of the setup time.
func TestBrowserOverTCPWithUDPBlocked(t *testing.T) {
	n := newUDPBlockedNet(t)
	w := n.startWorld(t)
	b := n.startBrowser(t, w)

	// The first call pays the browser's cold start (microphone, codecs);
	// the second is the baseline.
	coldMs, _, _ := browserCall(t, b, w)
	t.Logf("UDP allowed, first call (cold browser): click → connected %.0f ms", coldMs)
	udpMs, udpSig, udpRemote := browserCall(t, b, w)
	t.Logf("UDP allowed: click → connected %.0f ms (signaling %.0f ms) via %s", udpMs, udpSig, udpRemote)
	if udpRemote != w.Regions[0].GlobalRelay.PublicAddr().String() {
		t.Errorf("with UDP allowed the call went via %s, want the nearest POP's UDP VIP %v: UDP must win", udpRemote, w.Regions[0].GlobalRelay.PublicAddr())
	}

	n.blockUDP()
	tcpBefore := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_established_total", nil)
	flowsBefore := metricSum(t, w.Registry, "rtcedge_globalrelay_flows_created_total", nil)
	nearPOP := map[string]string{"pop": w.Regions[0].Spec.POPName}
	waitsBefore, waitBefore := histogramTotals(t, w.Registry, "rtcedge_globalrelay_tcp_first_frame_seconds", nearPOP)
	tcpMs, tcpSig, tcpRemote := browserCall(t, b, w)
	t.Logf("UDP blocked: click → connected %.0f ms (signaling %.0f ms) via %s; %d UDP datagrams dropped by the firewall",
		tcpMs, tcpSig, tcpRemote, n.droppedUDP())
	t.Logf("setup over TCP minus over UDP, same browser and world (veth, no delay): %+.0f ms", tcpMs-udpMs)
	// Where the difference goes: the browser connects to every POP's TCP
	// port at once, then waits for its check schedule to reach each pair.
	waits, wait := histogramTotals(t, w.Registry, "rtcedge_globalrelay_tcp_first_frame_seconds", nearPOP)
	if waits <= waitsBefore {
		t.Errorf("no TCP connection to the nearest POP had its first frame timed")
	} else {
		t.Logf("nearest POP: TCP accept → first check on the connection %.0f ms (mean of %d)", 1000*(wait-waitBefore)/float64(waits-waitsBefore), waits-waitsBefore)
	}

	if tcpRemote != w.Regions[0].TCPAddr.String() && tcpRemote != w.Regions[1].TCPAddr.String() {
		t.Errorf("UDP-blocked call's selected remote %s is not a POP's TCP address (%v, %v)", tcpRemote, w.Regions[0].TCPAddr, w.Regions[1].TCPAddr)
	}
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_established_total", nil); v <= tcpBefore {
		t.Errorf("no TCP connection established at a POP")
	}
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_flows_created_total", nil); v != flowsBefore {
		t.Errorf("%v UDP flows created while UDP was blocked", v-flowsBefore)
	}
	if d := n.droppedUDP(); d == 0 {
		t.Error("the firewall dropped no UDP: the browser never tried UDP, so the test proves nothing")
	}
	for _, m := range []struct{ name, dir string }{
		{"rtcedge_globalrelay_tcp_frames_total", "to_cluster"},
		{"rtcedge_globalrelay_tcp_frames_total", "to_client"},
	} {
		if v := metricSum(t, w.Registry, m.name, map[string]string{"direction": m.dir}); v < 50 {
			t.Errorf("%s{direction=%q} = %v, want ≥ 50", m.name, m.dir, v)
		}
	}
}
