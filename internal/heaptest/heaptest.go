// Package heaptest measures what a test's objects keep alive: the
// bounds tests compare the live heap around many calls (docs/operations.md,
// "Per-call bounds"), which a loaded machine's timing does not move.
package heaptest

import (
	"runtime"
	"runtime/metrics"
)

// Live returns the live heap in bytes: the least of three collections'
// measures. A collection counts as live what goroutines allocate while it
// marks, so one that runs while a call reads a large event finds the
// event's buffer live even after it is dropped; what a call holds is
// live in all three.
func Live() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	least := int64(-1)
	for range 3 {
		runtime.GC()
		metrics.Read(s)
		if v := int64(s[0].Value.Uint64()); least < 0 || v < least {
			least = v
		}
	}
	return least
}
