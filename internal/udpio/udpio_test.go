package udpio

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestListenReusePort: the sockets share one address, and datagrams sent to
// it are delivered to one of them.
func TestListenReusePort(t *testing.T) {
	conns, err := ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	addr := LocalAddrPort(conns[0])
	for _, c := range conns[1:] {
		if LocalAddrPort(c) != addr {
			t.Fatalf("socket on %v, want %v", LocalAddrPort(c), addr)
		}
	}
	if _, err := ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 0); err == nil {
		t.Error("zero sockets accepted")
	}
}

func TestListenWorkerPairs(t *testing.T) {
	pubs, ins, err := ListenWorkerPairs(netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("127.0.0.1:0"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range append(pubs, ins...) {
			c.Close()
		}
	}()
	if len(pubs) != 2 || len(ins) != 2 || LocalAddrPort(pubs[0]) != LocalAddrPort(pubs[1]) || LocalAddrPort(ins[0]) == LocalAddrPort(ins[1]) {
		t.Fatalf("pubs %v ins %v: want one shared public address and two internal ones", pubs, ins)
	}
}

// TestDrops: every label's series exists at zero from the start, a typed
// reason counts under its own label without allocating, and a reason with
// no label counts under reason 0 (the catch-all).
func TestDrops(t *testing.T) {
	type reason uint8
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_dropped_total", Help: "x"}, []string{"reason"})
	d := NewDrops[reason](vec, "p_", "other", "a", "b")
	ch := make(chan prometheus.Metric, 10)
	vec.Collect(ch)
	if n := len(ch); n != 3 {
		t.Fatalf("%d series at start, want 3", n)
	}
	if a := testing.AllocsPerRun(100, func() { d.Inc(1) }); a != 0 {
		t.Errorf("Inc: %v allocations", a)
	}
	d.Inc(7)
	if v := value(t, vec, "p_a"); v != 101 {
		t.Errorf("p_a = %v, want 101", v)
	}
	if v := value(t, vec, "p_other"); v != 1 {
		t.Errorf("p_other = %v, want 1 (the unlabelled reason)", v)
	}
}

func value(t *testing.T, vec *prometheus.CounterVec, label string) float64 {
	t.Helper()
	var m dto.Metric
	if err := vec.WithLabelValues(label).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestRunner: whatever the tuning (plain reads, batches, the event loop),
// a worker's path forwards, its socket can be written from outside the
// loops (Writer), and Close ends Run with nil after closing the sockets.
func TestRunner(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    Tuning
	}{
		{"plain", Tuning{}},
		{"batch", Tuning{Batch: 32, LockThreads: true}},
		{"event-loop", Tuning{Batch: 32, EventLoop: new(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			front, peer, sink := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
			to := LocalAddrPort(sink)
			r, err := NewRunner(tc.t, slog.Default(), []Path{{From: front, To: front, Limit: 1500,
				Decide: func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) { return buf[:n], to, true }}})
			if err != nil {
				t.Fatal(err)
			}
			if r.EventLoop() != (tc.t.EventLoop != nil && LoopSupported) {
				t.Fatalf("EventLoop() = %v", r.EventLoop())
			}
			done := make(chan error, 1)
			go func() { done <- r.Run() }()
			addr := LocalAddrPort(front)
			if _, err := peer.WriteToUDPAddrPort([]byte("through"), addr); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Writer(front).WriteToUDPAddrPort([]byte("beside"), to); err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			buf := make([]byte, 64)
			for range 2 {
				_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, _, err := sink.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatal(err)
				}
				got[string(buf[:n])] = true
			}
			if !got["through"] || !got["beside"] {
				t.Fatalf("sink got %v", got)
			}
			r.Close()
			if err := <-done; err != nil {
				t.Fatalf("Run after Close: %v", err)
			}
		})
	}
}

// TestRunnerRefusesNegativeCPU: a bad tuning is an error naming the key,
// and the sockets it was given are closed.
func TestRunnerRefusesNegativeCPU(t *testing.T) {
	c := listenT(t, "127.0.0.1:0")
	if _, err := NewRunner(Tuning{CPUs: []int{-1}}, slog.Default(), []Path{{From: c, To: c}}); err == nil {
		t.Fatal("accepted")
	}
	if _, err := c.WriteToUDPAddrPort([]byte{1}, LocalAddrPort(c)); err == nil {
		t.Fatal("socket still open")
	}
}
