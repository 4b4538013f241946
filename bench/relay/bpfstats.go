package relay

// The fast path's own cost: the run time the kernel accounts to its
// programs (kernel.bpf_stats_enabled, held on with ebpf.EnableStats for a
// -veth run), read beside the machine's CPU, which also holds it.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// progStat is one program's accumulated run time and run count.
type progStat struct {
	runtime time.Duration
	runs    uint64
}

// bpfRuntime reads the run time and run count of the fast path's programs
// that the processes pids hold (a program's or its link's descriptor,
// found in /proc/PID/fdinfo): only this trial's relays, not programs that
// other tests on the machine load and unload meanwhile.
func bpfRuntime(pids []int) map[ebpf.ProgramID]progStat {
	out := map[ebpf.ProgramID]progStat{}
	for _, id := range heldPrograms(pids) {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		if info, err := p.Info(); err == nil && fastPathPrograms[info.Name] {
			if st, err := p.Stats(); err == nil {
				out[id] = progStat{st.Runtime, st.RunCount}
			}
		}
		p.Close()
	}
	return out
}

// heldPrograms is the IDs of the BPF programs whose descriptors (or whose
// links' descriptors) the processes pids hold.
func heldPrograms(pids []int) []ebpf.ProgramID {
	seen := map[ebpf.ProgramID]bool{}
	var ids []ebpf.ProgramID
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			b, err := os.ReadFile(filepath.Join(dir, fd.Name()))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				v, ok := strings.CutPrefix(line, "prog_id:")
				if !ok {
					continue
				}
				if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil && !seen[ebpf.ProgramID(n)] {
					seen[ebpf.ProgramID(n)] = true
					ids = append(ids, ebpf.ProgramID(n))
				}
			}
		}
	}
	return ids
}

// bpfDelta is the run time and run count between two readings, over the
// programs present in both.
func bpfDelta(s0, s1 map[ebpf.ProgramID]progStat) (time.Duration, uint64) {
	var d time.Duration
	var runs uint64
	for id, b := range s1 {
		if a, ok := s0[id]; ok && b.runs >= a.runs {
			d += b.runtime - a.runtime
			runs += b.runs - a.runs
		}
	}
	return d, runs
}
