package capacity

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Pinning gives the pod its own cores: the pod runs on PodCPUs (taskset,
// GOMAXPROCS equal to their count), the load side (this process, the load
// generator, and the reference server) on LoadCPUs. Static once made.
type Pinning struct {
	PodCPUs  []int `json:"pod_cpus"`
	LoadCPUs []int `json:"load_cpus"`
}

// NewPinning splits the CPUs this process may run on: the last podCPUs of
// them for the pod, the rest for the load side. At least one must be left
// for the load side.
func NewPinning(podCPUs int) (*Pinning, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("capacity: sched_getaffinity: %w", err)
	}
	var cpus []int
	for i := range 1024 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if podCPUs <= 0 || podCPUs >= len(cpus) {
		return nil, fmt.Errorf("capacity: -pod-cpus %d: want 1 to %d (this process may run on %d CPUs, one at least left for the load side)", podCPUs, len(cpus)-1, len(cpus))
	}
	cut := len(cpus) - podCPUs
	return &Pinning{PodCPUs: cpus[cut:], LoadCPUs: cpus[:cut]}, nil
}

// cpuList renders CPUs as taskset's -c list.
func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// pinnedCommand returns the argv and extra environment that run bin args on
// cpus: under taskset (the process and every thread it makes inherit the
// mask), with GOMAXPROCS equal to the CPU count.
func pinnedCommand(cpus []int, bin string, args ...string) (argv, env []string) {
	if len(cpus) == 0 {
		return append([]string{bin}, args...), nil
	}
	return append([]string{"taskset", "-c", cpuList(cpus), bin}, args...), []string{"GOMAXPROCS=" + strconv.Itoa(len(cpus))}
}

// PinSelf pins every thread of this process (the load generator) to the
// load CPUs and sets GOMAXPROCS to their count; threads made later inherit
// the mask of the thread that makes them.
func (p *Pinning) PinSelf() error {
	var set unix.CPUSet
	for _, c := range p.LoadCPUs {
		set.Set(c)
	}
	runtime.GOMAXPROCS(len(p.LoadCPUs))
	// Twice: a thread made while the first pass ran may have inherited
	// the old mask.
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("capacity: pin the load generator: %w", err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("capacity: pin thread %d of the load generator: %w", tid, err)
			}
		}
	}
	return nil
}

// CPUTimes is each CPU's busy and total time from /proc/stat, by CPU
// number.
type CPUTimes map[int]MachineStat

// ReadCPUTimes reads the per-CPU lines of /proc/stat.
func ReadCPUTimes() (CPUTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	out := CPUTimes{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "cpu") || strings.HasPrefix(line, "cpu ") {
			continue
		}
		f := strings.Fields(line)
		n, err := strconv.Atoi(strings.TrimPrefix(f[0], "cpu"))
		if err != nil {
			continue
		}
		ms, err := parseCPULine(f)
		if err != nil {
			return nil, err
		}
		out[n] = ms
	}
	return out, nil
}

// Busy returns the share of cpus' time (0..1, averaged over them) that
// was busy between a and b.
func Busy(a, b CPUTimes, cpus []int) float64 {
	var busy, total time.Duration
	for _, c := range cpus {
		busy += b[c].Busy - a[c].Busy
		total += b[c].Total - a[c].Total
	}
	if total <= 0 {
		return 0
	}
	return float64(busy) / float64(total)
}

// Limits of a pinned step (Verdict).
const (
	// PinnedMaxLoss is the reply loss a held step stays under.
	PinnedMaxLoss = 0.01
	// PinnedMinSent is the share of the frames the load generator must
	// have sent on time.
	PinnedMinSent = 0.99
	// PinnedMaxPodBusy is how busy the pod may keep its cores (its own
	// CPU time over them: the machine's other work on those cores is not
	// the pod's).
	PinnedMaxPodBusy = 0.80
	// PinnedMinToBackend is the audio (s/s per call) the pod must keep
	// sending to the server: it kept up decoding the callers.
	PinnedMinToBackend = 0.98
	// PinnedMinReply is the share of the conversation's reply audio
	// (Conversation.ModelShare) the callers must get; below it the
	// reference server fell behind.
	PinnedMinReply = 0.85
)

// Verdicts of a pinned step.
const (
	HeldByPod     = "held"
	NotHeldByPod  = "not held by the pod"
	NotHeldByLoad = "not held by the load side"
)

// Verdict judges a step run with the pod on its own cores: held when the
// reply loss is under PinnedMaxLoss, no call was lost or failed to set up,
// the load generator sent PinnedMinSent of its frames on time, the pod
// kept its cores under PinnedMaxPodBusy and (with a Realtime backend,
// wantReply the conversation's reply share) it sent the callers' audio to
// the server and the callers got the replies. A failing step is put down
// to the load side when the load generator sent late or the reference
// server's replies fell short while the pod itself was within its limits:
// it then says nothing of the pod.
func Verdict(st Step, wantReply float64) (verdict, why string) {
	var pod, load []string
	if st.Loss >= PinnedMaxLoss {
		pod = append(pod, fmt.Sprintf("reply loss %.2f %%", 100*st.Loss))
	}
	if st.Lost > 0 {
		pod = append(pod, fmt.Sprintf("%d calls lost", st.Lost))
	}
	if st.SetupFailures > 0 {
		pod = append(pod, fmt.Sprintf("%d setup failures", st.SetupFailures))
	}
	if st.PodShare >= PinnedMaxPodBusy {
		pod = append(pod, fmt.Sprintf("pod %.0f %% of its cores", 100*st.PodShare))
	}
	if wantReply > 0 && st.ToBackend < PinnedMinToBackend {
		pod = append(pod, fmt.Sprintf("%.3f s/s of audio per call to the server", st.ToBackend))
	}
	if st.SentRatio < PinnedMinSent || st.Underruns > 0 {
		load = append(load, fmt.Sprintf("load generator sent %.1f %% of the frames, %d late", 100*st.SentRatio, st.Underruns))
	}
	if wantReply > 0 && st.ToCaller+st.ReplyDropped < PinnedMinReply*wantReply {
		load = append(load, fmt.Sprintf("%.3f s/s of reply per call, want %.3f", st.ToCaller+st.ReplyDropped, wantReply))
	}
	switch {
	case len(pod) == 0 && len(load) == 0:
		return HeldByPod, ""
	case len(load) > 0 && (len(pod) == 0 || st.PodShare < PinnedMaxPodBusy):
		// A starved load side also loses calls and replies: the pod
		// within its CPU is not to blame.
		return NotHeldByLoad, strings.Join(append(load, pod...), ", ")
	}
	return NotHeldByPod, strings.Join(append(pod, load...), ", ")
}
