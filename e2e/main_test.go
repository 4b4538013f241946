// Package e2e runs whole-system tests: the dev world on loopback with real
// Pion clients (and, in browser tests, real Chromium).
package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
