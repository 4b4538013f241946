package capacity

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/backend/echo"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/transceiver"
)

// testHop is the inter-tier key the test pod and its link share.
var testHop = func() *encap.Keyring {
	k, err := encap.NewKeyring(1, map[uint8][]byte{1: make([]byte, encap.KeyLen)})
	if err != nil {
		panic(err)
	}
	return k
}()

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startPod runs a transceiver in this process on a loopback socket and
// returns its data address and session API URL; tune adjusts its config.
func startPod(t *testing.T, tune func(*transceiver.Config)) (*net.UDPConn, string) {
	t.Helper()
	keys, err := token.NewKeyring(1, map[uint8][]byte{1: make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := transceiver.Config{
		Cluster: 1, Pod: 1, Keys: keys, Hop: testHop, Backend: echo.Backend{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if tune != nil {
		tune(&cfg)
	}
	tr, err := transceiver.New(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	api := httptest.NewServer(tr.Handler())
	t.Cleanup(func() {
		api.Close()
		cancel()
		<-done
	})
	return conn, api.URL
}

// TestFleetEchoes checks the load generator itself: a few clients reach an
// in-process pod through a Link, and their audio comes back. It runs with
// the pod as DTLS client and as DTLS server (the pod's media path derives
// its SRTP keys by role: a wrong role decrypts nothing) and with the media
// on Pion's path.
func TestFleetEchoes(t *testing.T) {
	for _, tc := range []struct {
		name string
		tune func(*transceiver.Config)
	}{
		{"pod is DTLS client", nil},
		{"pod is DTLS server", func(c *transceiver.Config) { c.DTLSRole = "server" }},
		{"Pion's media path", func(c *transceiver.Config) { c.PionMedia = true }},
	} {
		t.Run(tc.name, func(t *testing.T) { fleetEchoes(t, tc.tune) })
	}
}

func fleetEchoes(t *testing.T, tune func(*transceiver.Config)) {
	conn, api := startPod(t, tune)
	link, err := NewLink(LinkConfig{Pod: conn.LocalAddr().(*net.UDPAddr).AddrPort(), Cluster: 1, PodID: 1, POP: 1, HopKeys: testHop})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	fleet, err := NewFleet(FleetConfig{Link: link, API: api, POP: 1, DataChannel: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 3 {
		if err := fleet.Add(ctx); err != nil {
			t.Fatalf("add client: %v", err)
		}
	}
	// Replies count by arrival in the window, sends by departure: keep
	// the window open until the audio has stopped and every echo is in.
	w := fleet.OpenWindow(time.Hour)
	fleet.SetAudio(true)
	deadline := time.Now().Add(10 * time.Second)
	for w.sent.Load() < 30 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d packets sent in 10 s", w.sent.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	fleet.SetAudio(false)
	for {
		sent, recv, _ := w.Loss()
		if recv >= sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("echo: %d of %d packets back", recv, sent)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p50, p99 := fleet.RTT()
	t.Logf("3 clients: rtt p50 %v p99 %v", p50, p99)
}

// TestFleetCountsReplies checks the load generator's replay and counting:
// the audio Pion made ahead (Prepare) is sent from the queues at real
// time, the echo is counted from its ciphertext, and only the sampled
// client's replies reach Pion to be decrypted. A tap that drops every
// fifth reply must show as 20 % loss by sequence numbers.
func TestFleetCountsReplies(t *testing.T) {
	conn, api := startPod(t, nil)
	link, err := NewLink(LinkConfig{Pod: conn.LocalAddr().(*net.UDPAddr).AddrPort(), Cluster: 1, PodID: 1, POP: 1, HopKeys: testHop})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	fleet, err := NewFleet(FleetConfig{Link: link, API: api, POP: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const clients = 4
	for range clients {
		if err := fleet.Add(ctx); err != nil {
			t.Fatalf("add client: %v", err)
		}
	}
	fleet.Prepare(time.Second)
	if q := fleet.Queued(); q != clients*51 {
		t.Fatalf("%d packets queued after Prepare(1s), want %d", q, clients*51)
	}
	// The last client loses every fifth reply before it is counted.
	last := fleet.snapshot()[clients-1]
	count := *last.conn.tap.Load()
	n := 0
	last.conn.setTap(func(b []byte) bool {
		if n++; n%5 == 0 {
			return false
		}
		return count(b)
	})
	fleet.SetAudio(true)
	wait := func(w *Window, enough func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !enough() {
			if time.Now().After(deadline) {
				sent, recv, _ := w.Loss()
				exp, _ := w.SeqLoss()
				t.Fatalf("after 10 s: %d sent, %d received, %d expected", sent, recv, exp)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	w := fleet.OpenWindow(time.Second)
	wait(w, func() bool {
		exp, _ := w.SeqLoss()
		return time.Now().After(fleet.start.Add(time.Duration(w.to))) && exp > 150
	})
	exp, seqLoss := w.SeqLoss()
	sent, recv, loss := w.Loss()
	t.Logf("%d sent, %d received, %d expected: loss %.1f %%, by sequence numbers %.1f %%", sent, recv, exp, 100*loss, 100*seqLoss)
	// One client of four loses a fifth: 5 %.
	if seqLoss < 0.03 || seqLoss > 0.07 {
		t.Errorf("loss by sequence numbers %.1f %%, want about 5 %%", 100*seqLoss)
	}
	if d := fleet.decrypting.Load(); d != 1 {
		t.Errorf("%d clients' replies reached Pion, want 1 (the sampled one)", d)
	}
	if u := fleet.Underruns.Load(); u != 0 {
		t.Errorf("%d underruns with a second queued", u)
	}
}
