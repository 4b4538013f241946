//go:build !race

package podnet

import (
	"testing"
	"time"
)

// tiersRound returns one media datagram's round trip through every tier:
// client → global relay → cluster relay → pod socket → (what Pion reads
// and writes) → cluster relay → global relay → client, both relays with
// batches of 32 and bundling on, and the pod socket's batched reader.
func tiersRound(t testing.TB) func() {
	tr := startTiersBatch(t, 32, true)
	tr.check(t)
	// Reads without a deadline (a deadline arms a timer per read); a
	// watchdog ends a stuck run instead.
	_ = tr.session.SetReadDeadline(time.Time{})
	_ = tr.client.SetReadDeadline(time.Time{})
	watchdog := time.AfterFunc(2*time.Minute, func() { tr.session.Close(); tr.client.Close() })
	t.Cleanup(func() { watchdog.Stop() })
	media := make([]byte, 160)
	media[0] = 0x80 // RTP
	buf, back := make([]byte, 2048), make([]byte, 2048)
	return func() {
		if _, err := tr.client.WriteToUDPAddrPort(media, tr.pub); err != nil {
			t.Fatal(err)
		}
		n, from, err := tr.session.ReadFromAddrPort(buf)
		if err != nil || n != len(media) || from != tr.clientAddr {
			t.Fatalf("pod read %d bytes from %v: %v", n, from, err)
		}
		if _, err := tr.pc.write(buf[:n], from, "feed"); err != nil {
			t.Fatal(err)
		}
		if n, _, err := tr.client.ReadFromUDPAddrPort(back); err != nil || n != len(media) {
			t.Fatalf("client read %d bytes: %v", n, err)
		}
	}
}

// TestTiersNoAllocs: with batching on, a media datagram's round trip
// through the global relay, the cluster relay and the pod socket allocates
// nothing in any tier. AllocsPerRun counts the whole process: every
// tier's goroutines are in it. (Without -race, which allocates itself.)
func TestTiersNoAllocs(t *testing.T) {
	round := tiersRound(t)
	round()
	if a := testing.AllocsPerRun(300, round); a != 0 {
		t.Errorf("%v allocations per round trip through all tiers", a)
	}
}

// BenchmarkTiersRoundTrip is TestTiersNoAllocs's round trip, timed, one
// datagram in flight: `go test -run '^$' -bench TiersRoundTrip ./transceiver/`.
func BenchmarkTiersRoundTrip(b *testing.B) {
	round := tiersRound(b)
	round()
	b.ReportAllocs()
	for b.Loop() {
		round()
	}
}
