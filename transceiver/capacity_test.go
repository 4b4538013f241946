package transceiver_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend/echo"
	"github.com/rtcedge/rtcedge/bench/capacity"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/transceiver"
)

// benchPod is a transceiver with the echo backend on a loopback socket,
// one connected client, and a raw socket that replays that client's
// recorded SRTP into the pod and reads the echo.
type benchPod struct {
	link  *capacity.Link
	fleet *capacity.Fleet
	relay *net.UDPConn // stands in for the cluster relay during replay
	pod   *net.UDPAddr
}

// benchHop is the inter-tier key the pod and the link share.
var benchHop = func() *encap.Keyring {
	k, err := encap.NewKeyring(1, map[uint8][]byte{1: make([]byte, encap.KeyLen)})
	if err != nil {
		panic(err)
	}
	return k
}()

func newBenchPod(b *testing.B) *benchPod {
	b.Helper()
	keys, err := token.NewKeyring(1, map[uint8][]byte{1: make([]byte, 32)})
	if err != nil {
		b.Fatal(err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	podAddr := conn.LocalAddr().(*net.UDPAddr)
	tr, err := transceiver.New(transceiver.Config{
		Cluster: 1, Pod: 1, Keys: keys, Hop: benchHop, Backend: echo.Backend{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, conn)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	api := httptest.NewServer(tr.Handler())
	bp := &benchPod{pod: podAddr}
	b.Cleanup(func() {
		if bp.fleet != nil {
			bp.fleet.Close()
		}
		if bp.link != nil {
			bp.link.Close()
		}
		if bp.relay != nil {
			bp.relay.Close()
		}
		api.Close()
		cancel()
		<-done
	})
	if bp.link, err = capacity.NewLink(capacity.LinkConfig{Pod: podAddr.AddrPort(), Cluster: 1, PodID: 1, POP: 1, HopKeys: benchHop}); err != nil {
		b.Fatal(err)
	}
	if bp.fleet, err = capacity.NewFleet(capacity.FleetConfig{Link: bp.link, API: api.URL, POP: 1}); err != nil {
		b.Fatal(err)
	}
	actx, acancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer acancel()
	if err := bp.fleet.Add(actx); err != nil {
		b.Fatal(err)
	}
	if bp.relay, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		b.Fatal(err)
	}
	_ = bp.relay.SetReadBuffer(4 << 20)
	return bp
}

// record makes n encrypted audio packets of the client without sending
// them.
func (bp *benchPod) record(b *testing.B, n int) [][]byte {
	bp.link.StartRecording()
	bp.fleet.SendFrames(n)
	pkts := bp.link.StopRecording()
	if len(pkts) != n {
		b.Fatalf("recorded %d packets, want %d", len(pkts), n)
	}
	return pkts
}

// isEcho tells the echoed audio (RTP, payload type 111 as the answer
// negotiates) from the pod's other traffic to the client.
func isEcho(pkt []byte) bool {
	// Skip the encapsulation header, whose length depends on the address
	// families and the inter-tier tag: a fixed offset read nothing but
	// misses once the header grew, and every echo timed out.
	_, hl, err := encap.Decode(pkt)
	return err == nil && len(pkt) > hl+12 && pkt[hl] >= 128 && pkt[hl] <= 191 && pkt[hl+1]&0x7f == 111
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEchoPacket times the pod's per-packet path for one session:
// pod socket read → encapsulation → Pion (ICE mux, SRTP decrypt,
// interceptors) → echo backend → Opus sample writer → SRTP encrypt → pod
// socket write. The client's packets are recorded beforehand and replayed
// from a raw socket, so the timed loop holds no client-side WebRTC work; at
// most 16 packets are in flight. cpu-ns/op is this process's CPU time per
// echoed packet (both cores), the figure that bounds sessions per core.
func BenchmarkEchoPacket(b *testing.B) {
	bp := newBenchPod(b)
	const window = 16
	pkts := bp.record(b, b.N)
	tokens := make(chan struct{}, window)
	for range window {
		tokens <- struct{}{}
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 2048)
		for {
			n, _, err := bp.relay.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if isEcho(buf[:n]) {
				select {
				case tokens <- struct{}{}:
				default:
				}
			}
		}
	}()
	// One timer for the whole loop: the loop itself must not allocate.
	timeout := time.NewTimer(time.Hour)
	defer timeout.Stop()
	take := func() bool {
		select {
		case <-tokens:
			return true
		default:
		}
		timeout.Reset(100 * time.Millisecond)
		select {
		case <-tokens:
			return true
		case <-timeout.C:
			return false
		}
	}
	podAddr := bp.pod.AddrPort()
	lost := 0
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		if !take() {
			lost++ // an echo went missing: go on without its token
		}
		if _, err := bp.relay.WriteToUDPAddrPort(pkts[i], podAddr); err != nil {
			b.Fatal(err)
		}
	}
	// Wait for the last echoes before stopping the clock.
	for range window {
		take()
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	if lost > 0 {
		b.ReportMetric(float64(lost)/float64(b.N), "lost/op")
	}
	bp.relay.Close()
	<-readDone
}
