// Package e2e runs whole-system tests: the dev world on loopback with real
// Pion clients (and, in browser tests, real Chromium).
package e2e

import (
	"testing"

	"github.com/rtcedge/rtcedge/internal/testleak"
)

// TestMain checks for leaked goroutines, once memberlist's probes of the
// stopped worlds have ended.
func TestMain(m *testing.M) { testleak.Main(m) }
