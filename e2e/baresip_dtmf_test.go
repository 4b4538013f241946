package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
)

// baresipCtl is a running baresip driven over its ctrl_tcp module:
// commands in, events out, netstring-framed JSON both ways.
type baresipCtl struct {
	t      *testing.T
	conn   net.Conn
	events chan map[string]any
}

// startBaresip runs baresip with the ctrl_tcp module on a free port, its
// audio a file of silence, and connects to it.
func startBaresip(t *testing.T, ctx context.Context) *baresipCtl {
	t.Helper()
	bin, err := exec.LookPath("baresip")
	if err != nil {
		t.Fatal("baresip is not installed: run scripts/test-deps.sh (apt-get install baresip-core)")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "in.wav"), wav(make([]int16, 60*8000), 8000), 0o600); err != nil {
		t.Fatal(err)
	}
	sipPort, ctlPort := freePort(t), freePort(t)
	conf := fmt.Sprintf(`poll_method epoll
sip_listen 127.0.0.1:%d
net_interface 127.0.0.1
audio_player aufile,%s
audio_source aufile,%s
audio_alert aufile,%s
rtp_ports 32000-32999
rtp_timeout 0
ctrl_tcp_listen 127.0.0.1:%d
module_path /usr/lib/baresip/modules
module g711.so
module aufile.so
module account.so
module menu.so
module ctrl_tcp.so
`, sipPort, filepath.Join(dir, "out.wav"), filepath.Join(dir, "in.wav"), filepath.Join(dir, "alert.wav"), ctlPort)
	if err := os.WriteFile(filepath.Join(dir, "config"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	account := fmt.Sprintf("<sip:carrier@127.0.0.1:%d>;regint=0;audio_codecs=PCMU\n", sipPort)
	if err := os.WriteFile(filepath.Join(dir, "accounts"), []byte(account), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "-f", dir, "-t", "120")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("baresip:\n%s", out.String())
		}
	})
	var conn net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; {
		if conn, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ctlPort)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("baresip's control port: %v", err)
		}
		select {
		case <-exited:
			t.Fatalf("baresip exited:\n%s", out.String())
		case <-time.After(20 * time.Millisecond): // its start-up has no event to await
		}
	}
	t.Cleanup(func() { conn.Close() })
	b := &baresipCtl{t: t, conn: conn, events: make(chan map[string]any, 256)}
	go b.read()
	return b
}

// read turns the control connection's netstrings into events until it
// closes.
func (b *baresipCtl) read() {
	defer close(b.events)
	r := bufio.NewReader(b.conn)
	for {
		lenText, err := r.ReadString(':')
		if err != nil {
			return
		}
		n, err := strconv.Atoi(strings.TrimSuffix(lenText, ":"))
		if err != nil || n < 0 || n > 1<<20 {
			return
		}
		msg := make([]byte, n+1) // and the trailing ','
		if _, err := io.ReadFull(r, msg); err != nil {
			return
		}
		var m map[string]any
		if json.Unmarshal(msg[:n], &m) == nil && m["event"] == true {
			b.events <- m
		}
	}
}

// command sends one command line (as typed after '/').
func (b *baresipCtl) command(name, params string) {
	b.t.Helper()
	msg, _ := json.Marshal(map[string]string{"command": name, "params": params, "token": name})
	if _, err := fmt.Fprintf(b.conn, "%d:%s,", len(msg), msg); err != nil {
		b.t.Fatal(err)
	}
}

// await returns the next event of type typ, skipping others (passed to
// skip, when set).
func (b *baresipCtl) await(ctx context.Context, typ string, skip func(map[string]any)) map[string]any {
	b.t.Helper()
	for {
		select {
		case ev, ok := <-b.events:
			if !ok {
				b.t.Fatalf("baresip's control connection closed before %s", typ)
			}
			if ev["type"] == typ {
				return ev
			}
			if skip != nil {
				skip(ev)
			}
		case <-ctx.Done():
			b.t.Fatalf("no %s from baresip", typ)
		}
	}
}

// TestBaresipDTMFAndPodHangup: baresip calls the dev world's echo through
// both relay tiers and sends the 16 keys as RFC 4733 events; the pod gives
// each to the echo exactly once, the echo sends each back, and baresip
// detects each exactly once, in order. Then the pod ends the call (as a
// DELETE of its session does): baresip gets the front's BYE, and nothing
// is left of the call — no session, no dialog, no RTP registration, no
// route (one of baresip's last RTP idles out), no goroutine (TestMain's
// leak check).
func TestBaresipDTMFAndPodHangup(t *testing.T) {
	// Routes idle out after 2 s (RouteTTL) instead of 2 min, so that the
	// test sees the last one go (below).
	w := startWorld(t, devworld.Config{SIPAddr: "127.0.0.1:0", PodsPerCluster: 1, RelaysPerCluster: 1, RouteTTL: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b := startBaresip(t, ctx)
	b.command("dial", w.SIPURI)
	b.await(ctx, "CALL_ESTABLISHED", nil)

	const keys = "0123456789*#ABCD"
	var heard []string
	collect := func(ev map[string]any) {
		if ev["type"] == "CALL_DTMF_START" {
			heard = append(heard, fmt.Sprint(ev["param"]))
		}
	}
	// One key at a time, as a caller presses them: baresip sends each
	// key's start and end (sndcode), and the next key after the echo's
	// digit came back.
	for i := 0; i < len(keys); i++ {
		b.command("sndcode", keys[i:i+1])
		for len(heard) <= i {
			collect(b.await(ctx, "CALL_DTMF_START", nil))
		}
	}
	if got := strings.Join(heard, ""); got != keys {
		t.Errorf("baresip detected %q, want %q", got, keys)
	}
	for _, m := range []struct {
		dir, result string
		want        float64
	}{{"in", "digit", 16}, {"out", "sent", 16}} {
		if n := metricSum(t, w.Registry, "rtcedge_transceiver_call_dtmf_total", map[string]string{"direction": m.dir, "result": m.result}); n != m.want {
			t.Errorf("pod's DTMF %s %s: %v, want %v", m.dir, m.result, n, m.want)
		}
	}

	// The pod ends the call.
	var pod *devworld.Pod
	for _, rg := range w.Regions {
		for _, p := range rg.Pods {
			if len(p.Transceiver.Calls()) == 1 {
				pod = p
			}
		}
	}
	if pod == nil {
		t.Fatal("no pod holds the call")
	}

	if err := pod.Transceiver.EndSession(pod.Transceiver.Calls()[0]); err != nil {
		t.Fatal(err)
	}
	closed := b.await(ctx, "CALL_CLOSED", collect)
	t.Logf("baresip: call closed (%v)", closed["param"])
	if got := strings.Join(heard, ""); got != keys {
		t.Errorf("after the call: baresip detected %q, want %q", got, keys)
	}
	if n := metricSum(t, w.Registry, "rtcedge_sipfront_pod_hangups_total", map[string]string{"reason": "deleted"}); n != 1 {
		t.Errorf("pod hangups (deleted) counted %v, want 1", n)
	}
	left := func() string {
		routes, registered := pod.Transceiver.PacketState()
		return fmt.Sprintf("%d sessions, %d dialogs, %d RTP registrations, %d routes", w.Sessions(), w.SIP.Front().Dialogs(), registered, routes)
	}
	defer func() {
		if t.Failed() {
			t.Logf("left: %s", left())
		}
	}()
	// The pod removed the call's registration and routes when it ended
	// it (TestCallRTPTimeout checks the routes alone); RTP baresip sent
	// between that and its BYE (a few 20 ms packets) finds no call, and
	// its verified header may leave a provisional route, the socket's
	// soft state for any client, which idles out after RouteTTL.
	eventually(t, 10*time.Second, "nothing left of the call", func() bool {
		return left() == "0 sessions, 0 dialogs, 0 RTP registrations, 0 routes"
	})
	t.Log(left())
}
