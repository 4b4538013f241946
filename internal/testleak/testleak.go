// Package testleak is the TestMain of packages whose tests run dev worlds:
// it fails a passing run that leaves goroutines behind, after giving
// memberlist's probes the time they outlive their pool's Shutdown (up to
// a probe interval plus a probe timeout) to end. It holds no state; only
// tests import it.
package testleak

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Wait is how long the goroutines of stopped worlds may take to end:
// memberlist's probes outlive Shutdown by up to a probe interval plus a
// probe timeout (5 s and 3 s with the production WAN timings of the
// failure tests), longer than goleak's own retries wait. A goroutine still
// there after Wait is a leak.
const Wait = 15 * time.Second

// Main runs m's tests and exits with their code, or 1 when they passed
// but goroutines are still running after Wait.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for deadline := time.Now().Add(Wait); err != nil && time.Now().Before(deadline); err = goleak.Find() {
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Running returns the stacks of the goroutines with a frame whose name
// contains fn (e.g. "hashicorp/memberlist."), by goroutine id: taken
// once, without goleak's retries, for tests that check what is still
// running the moment a Close returned.
func Running(fn string) map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if id, _, ok := strings.Cut(strings.TrimPrefix(g, "goroutine "), " "); ok && strings.Contains(g, fn) {
			out[id] = g
		}
	}
	return out
}
