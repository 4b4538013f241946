//go:build race

package e2e

// raceEnabled: this test binary runs under the race detector, whose
// runtime distorts live-heap figures (see TestPerCallBounds).
const raceEnabled = true
