//go:build !race

package udpio

import (
	"testing"
	"time"
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
