//go:build !race

package udpio

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// TestBatchConnNoAllocs: a batch read and a batch write allocate nothing,
// per call or per datagram. (Without -race, which adds allocations of its
// own.)
func TestBatchConnNoAllocs(t *testing.T) {
	rx, tx := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	r, w := NewBatchConn(rx, 16), NewBatchConn(tx, 16)
	to := LocalAddrPort(rx)
	out := make([]Msg, 16)
	for i := range out {
		out[i] = Msg{Buf: make([]byte, 120), Addr: to}
	}
	in := make([]Msg, 16)
	for i := range in {
		in[i].Buf = make([]byte, 2048)
	}
	_ = rx.SetReadDeadline(time.Now().Add(time.Minute))
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := w.WriteBatch(out); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(out); {
			n, err := r.ReadBatch(in)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per batch of %d", allocs, len(out))
	}
}

// TestForwardBatchNoAllocs: datagrams through a running ForwardBatch loop
// (read batch, decide, write batch) allocate nothing. AllocsPerRun counts
// the whole process, so the loop's goroutine is counted too.
func TestForwardBatchNoAllocs(t *testing.T) {
	round := forwardRound(t)
	round() // the loop's first read parks it in the poller: settle that first
	if allocs := testing.AllocsPerRun(200, round); allocs != 0 {
		t.Errorf("%v allocations per 8 forwarded datagrams", allocs)
	}
}

// TestBundlingNoAllocs: a loop that bundles feeding a loop that unbundles
// allocates nothing per datagram either.
func TestBundlingNoAllocs(t *testing.T) {
	a, b, sink, client := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	toB, toSink := LocalAddrPort(b), LocalAddrPort(sink)
	done := make(chan error, 2)
	pass := func(to netip.AddrPort) Decide {
		return func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) { return buf[:n], to, true }
	}
	go func() { done <- ForwardBatch(a, a, 0, 1600, 32, pass(toB), Hooks{Bundle: encap.BundleFormat{}}) }()
	go func() { done <- ForwardBatch(b, b, 0, 1600, 32, pass(toSink), Hooks{Unbundle: encap.BundleFormat{}}) }()
	defer func() { a.Close(); b.Close(); <-done; <-done }()
	pkt := encapsulated(t, 1, make([]byte, 100)...)
	buf := make([]byte, 2048)
	dst := LocalAddrPort(a)
	_ = sink.SetReadDeadline(time.Now().Add(2 * time.Minute))
	round := func() { eightThrough(t, client, sink, dst, pkt, buf) }
	round()
	if allocs := testing.AllocsPerRun(200, round); allocs != 0 {
		t.Errorf("%v allocations per 8 datagrams bundled and unbundled", allocs)
	}
}
