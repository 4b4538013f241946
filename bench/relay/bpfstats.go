package relay

// The fast path's own cost: the run time the kernel accounts to its
// programs (kernel.bpf_stats_enabled, held on with ebpf.EnableStats for a
// -veth run), read beside the machine's CPU, which also holds it.

import (
	"io"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// fastPathPrograms are the names of the relays' programs
// (internal/fastpath/bpf/fastpath.c).
var fastPathPrograms = map[string]bool{"global_relay": true, "cluster_relay": true}

// enableBPFStats turns the kernel's program run-time accounting on until
// the closer is closed.
func enableBPFStats() (io.Closer, error) {
	return ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
}

// lastProgramID is the highest ID of a loaded program: a trial counts
// only programs loaded after it.
func lastProgramID() ebpf.ProgramID {
	var last ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(last)
		if err != nil {
			return last
		}
		last = next
	}
}

// bpfRuntime sums the run time and run count of the fast path's programs
// loaded after the program ID after.
func bpfRuntime(after ebpf.ProgramID) (time.Duration, uint64) {
	var total time.Duration
	var runs uint64
	for id := after; ; {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			return total, runs
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		if info, err := p.Info(); err == nil && fastPathPrograms[info.Name] {
			if st, err := p.Stats(); err == nil {
				total += st.Runtime
				runs += st.RunCount
			}
		}
		p.Close()
	}
}
