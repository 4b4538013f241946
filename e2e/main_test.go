// Package e2e runs whole-system tests: the dev world on loopback with real
// Pion clients (and, in browser tests, real Chromium).
package e2e

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// leakWait is how long the goroutines of stopped worlds may take to end.
// memberlist's probes outlive its Shutdown by up to a probe interval plus
// a probe timeout (5 s and 3 s with the production WAN timings of the
// failure tests), longer than goleak's own retries wait; a goroutine still
// there after leakWait is a leak.
const leakWait = 15 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for deadline := time.Now().Add(leakWait); err != nil && time.Now().Before(deadline); err = goleak.Find() {
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
