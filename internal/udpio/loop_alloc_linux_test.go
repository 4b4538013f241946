//go:build !race

package udpio

import (
	"runtime"
	"testing"
	"time"
)

// TestLoopNoAllocs: datagrams both ways through a running Loop (read
// batch, decide, write batch, per direction) allocate nothing, counted over
// the whole process, the loop's thread included.
func TestLoopNoAllocs(t *testing.T) {
	front, back := detachT(t), detachT(t)
	peer, client := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	loopT(t, relayPaths(front, back, LocalAddrPort(peer), Hooks{}))
	pkt, buf := make([]byte, 120), make([]byte, 2048)
	_ = peer.SetReadDeadline(time.Now().Add(2 * time.Minute))
	_ = client.SetReadDeadline(time.Now().Add(2 * time.Minute))
	round := func() {
		for range 8 {
			if _, err := client.WriteToUDPAddrPort(pkt, front.LocalAddrPort()); err != nil {
				t.Fatal(err)
			}
		}
		for range 8 {
			n, from, err := peer.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := peer.WriteToUDPAddrPort(buf[:n], from); err != nil {
				t.Fatal(err)
			}
		}
		for range 8 {
			if _, _, err := client.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	round()
	// Counted by hand as testing.AllocsPerRun counts (whole allocations per
	// round: the runtime's own now and then are not the loop's), since it
	// sets GOMAXPROCS to 1, which leaves the test only the P the loop
	// holds while it waits.
	const rounds = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range rounds {
		round()
	}
	runtime.ReadMemStats(&after)
	if allocs := (after.Mallocs - before.Mallocs) / rounds; allocs != 0 {
		t.Errorf("%v allocations per 8 datagrams each way", allocs)
	}
}
