package fastpathcall

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/internal/proctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(proctest.Main(m)) }
