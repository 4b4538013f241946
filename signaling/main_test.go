package signaling_test

import (
	"testing"

	"github.com/rtcedge/rtcedge/internal/testleak"
)

// TestMain fails a passing run that leaves goroutines behind, after
// giving memberlist's probes of the WAN-timed pools (steering_test.go)
// the time they outlive their pool's Shutdown.
func TestMain(m *testing.M) {
	testleak.Main(m)
}
