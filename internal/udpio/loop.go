package udpio

import (
	"runtime"
	"sync"
)

// procsMu serialises the event loops' changes of GOMAXPROCS: procsBase is
// what it was when the first of the running loops started, procsAdded how
// many Ps the running loops added. Setting base + added, rather than
// adding to whatever GOMAXPROCS is, keeps the count right when something
// else saves and restores GOMAXPROCS around a loop's start or end.
var (
	procsMu    sync.Mutex
	procsBase  int
	procsAdded int
)

func addProcs(d int) {
	procsMu.Lock()
	defer procsMu.Unlock()
	if procsAdded == 0 {
		procsBase = runtime.GOMAXPROCS(0)
	}
	procsAdded += d
	runtime.GOMAXPROCS(procsBase + procsAdded)
}

// Procs is GOMAXPROCS without the Ps running event loops added (Loop.Run):
// the CPUs the process was given, for sizing workers and readers. Sizing
// by GOMAXPROCS itself would grow with every loop started in the process.
func Procs() int {
	procsMu.Lock()
	defer procsMu.Unlock()
	if procsAdded == 0 {
		return runtime.GOMAXPROCS(0)
	}
	return procsBase
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
