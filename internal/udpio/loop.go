package udpio

import (
	"runtime"
	"sync"
)

// procsMu serialises the event loops' changes of GOMAXPROCS; procsAdded is
// how many Ps the running loops added.
var (
	procsMu    sync.Mutex
	procsAdded int
)

func addProcs(d int) {
	procsMu.Lock()
	defer procsMu.Unlock()
	procsAdded += d
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + d)
}

// Procs is GOMAXPROCS without the Ps running event loops added (Loop.Run):
// the CPUs the process was given, for sizing workers and readers. Sizing
// by GOMAXPROCS itself would grow with every loop started in the process.
func Procs() int {
	procsMu.Lock()
	defer procsMu.Unlock()
	return max(runtime.GOMAXPROCS(0)-procsAdded, 1)
}

// LoopPath is one direction a Loop forwards: datagrams read on From are
// decided and sent on To, exactly as ForwardBatch(From, To, Headroom,
// Limit, Batch, Decide, Hooks) would (Hooks.BlockingReads does not apply).
// From and To may be the same socket.
type LoopPath struct {
	From, To        *RawConn
	Headroom, Limit int
	Batch           int
	Decide          Decide
	Hooks           Hooks
}
