// Package heaptest measures what a test's objects keep alive: the
// bounds tests compare the live heap around many calls (docs/operations.md,
// "Per-call bounds"), which a loaded machine's timing does not move.
package heaptest

import (
	"runtime"
	"runtime/metrics"
)

// Live collects garbage twice and returns the heap the last collection
// found live, in bytes: not what other goroutines allocated since.
func Live() int64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}
