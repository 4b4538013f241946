package sipfront_test

import (
	"testing"

	"github.com/rtcedge/rtcedge/internal/testleak"
)

func TestMain(m *testing.M) { testleak.Main(m) }
