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
	fleet.SetAudio(true)
	w := fleet.OpenWindow(500 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		sent, recv, _ := w.Loss()
		if time.Now().After(deadline) {
			t.Fatalf("echo: %d of %d packets back", recv, sent)
		}
		if sent >= 30 && recv >= sent {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	p50, p99 := fleet.RTT()
	t.Logf("3 clients: rtt p50 %v p99 %v", p50, p99)
}
