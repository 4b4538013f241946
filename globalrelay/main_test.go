package globalrelay

// The package's tests leave no goroutine behind (goleak).

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
