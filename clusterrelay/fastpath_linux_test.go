package clusterrelay

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
)

// metricValue reads a counter or gauge with the given label (none: "").
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if match {
				if m.Counter != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// TestFastPathOverVeth: a running relay with fast_path tc, in a namespace
// of its own reached over a veth pair: the first datagram from a global
// relay ingress goes up (user space records the ingress), the next ones
// and the pod's replies are forwarded by the kernel, byte for byte, and
// packets_total counts both paths. The pods come from a Directory, as in
// the node (NewNode), which the gossip watcher fills after the start.
func TestFastPathOverVeth(t *testing.T) {
	p := fptest.NewPair(t)
	conn := p.B.ListenUDP(netip.AddrPortFrom(p.AddrB, 7100))
	ingress := p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 3478))
	pod := p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 5000))
	reg := prometheus.NewRegistry()
	var r *Relay
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// New finds the interface and attaches inside the relay's namespace.
	dir := NewDirectory()
	must(p.B.In(func() error {
		var err error
		r, err = New(Config{Cluster: 5, Pods: dir, Hop: testHop,
			FastPath: fastpath.ModeTC, Logger: quiet, Registerer: reg}, conn)
		return err
	}))
	dir.SetPods([]PodInfo{{ID: 1, Data: addrOf(pod)}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if metricValue(t, reg, "rtcedge_clusterrelay_fast_path_active", "", "") != 1 {
		t.Fatal("fast path not active")
	}

	h := encap.Header{Cluster: 5, Pod: 1, POP: 1, Client: netip.MustParseAddrPort("198.51.100.7:40000"), Ingress: addrOf(ingress)}
	rtp := append([]byte{0x80, 111, 0, 1}, bytes.Repeat([]byte{0x55}, 100)...)
	up := seal(t, testHop, h, string(rtp))
	h.ToClient = true
	down := seal(t, testHop, h, string(rtp[:50]))
	const rounds = 5
	for range rounds {
		if _, err := ingress.WriteToUDPAddrPort(up, r.Addr()); err != nil {
			t.Fatal(err)
		}
		if got := read(t, pod); !bytes.Equal(got, up) {
			t.Fatalf("pod got % x", got)
		}
		if _, err := pod.WriteToUDPAddrPort(down, r.Addr()); err != nil {
			t.Fatal(err)
		}
		if got := read(t, ingress); !bytes.Equal(got, down) {
			t.Fatalf("ingress got % x", got)
		}
	}
	// The counters reach the metrics within a second or so.
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, reg, "rtcedge_clusterrelay_packets_total", "direction", "to_pod") < rounds ||
		metricValue(t, reg, "rtcedge_clusterrelay_packets_total", "direction", "to_client") < rounds {
		if time.Now().After(deadline) {
			t.Fatalf("packets_total to_pod %v to_client %v, want %d each",
				metricValue(t, reg, "rtcedge_clusterrelay_packets_total", "direction", "to_pod"),
				metricValue(t, reg, "rtcedge_clusterrelay_packets_total", "direction", "to_client"), rounds)
		}
		time.Sleep(50 * time.Millisecond)
	}
	kp := metricValue(t, reg, "rtcedge_clusterrelay_fast_path_packets_total", "verdict", "forward_pod")
	kc := metricValue(t, reg, "rtcedge_clusterrelay_fast_path_packets_total", "verdict", "forward_client")
	if kp != rounds-1 || kc != rounds {
		t.Fatalf("the kernel forwarded %v toward the pod and %v toward the ingress, want %d and %d", kp, kc, rounds-1, rounds)
	}
	if v := metricValue(t, reg, "rtcedge_clusterrelay_packets_total", "direction", "to_pod"); v != rounds {
		t.Fatalf("packets_total to_pod %v, want %d", v, rounds)
	}
}

// TestFastPathAutoFallback: with fast_path auto where the kernel path
// cannot help (the relay on loopback), the relay forwards in user space
// and says so once in its log and in a metric.
func TestFastPathAutoFallback(t *testing.T) {
	var logs lockedBuffer
	reg := prometheus.NewRegistry()
	pod := listen(t)
	r, err := New(Config{Cluster: 5, Pods: NewPods(map[uint16]netip.AddrPort{1: addrOf(pod)}), Hop: testHop,
		FastPath: fastpath.ModeAuto, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg}, listen(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if n := strings.Count(logs.String(), `msg="fast path unavailable`); n != 1 {
		t.Fatalf("%d log lines about the fast path:\n%s", n, logs.String())
	}
	if metricValue(t, reg, "rtcedge_clusterrelay_fast_path_unavailable_total", "", "") != 1 ||
		metricValue(t, reg, "rtcedge_clusterrelay_fast_path_active", "", "") != 0 {
		t.Fatal("metrics do not say the fast path is off")
	}
	if r.kernel != nil {
		t.Fatal("attached anyway")
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
