package capacity

import (
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine says what the machine was and how loaded, so that a figure can be
// read against the conditions it was taken in.
type Machine struct {
	CPUModel  string     `json:"cpu_model"` // /proc/cpuinfo "model name"
	CPUs      int        `json:"cpus"`
	GoVersion string     `json:"go_version"`
	Load      [3]float64 `json:"load"` // /proc/loadavg: 1, 5 and 15 minute averages
}

// ReadMachine reads the CPU model and the load averages now.
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Load: LoadAvgs()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// LoadAvgs returns the three load averages of /proc/loadavg (zeros when it
// cannot be read).
func LoadAvgs() [3]float64 {
	var out [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		out[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return out
}

// Report is one `make bench-capacity` run as JSON: when and where it ran,
// how loaded the machine was before and after, every step and the fit.
type Report struct {
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Before   Machine   `json:"before"`
	After    Machine   `json:"after"`
	Settings struct {
		Window      time.Duration `json:"window_ns"`
		IdleWindow  time.Duration `json:"idle_window_ns"`
		DataChannel bool          `json:"data_channel"`
		PodConfig   string        `json:"pod_config,omitempty"`
		Backend     string        `json:"backend,omitempty"`
		// Conversation names the shape of a transcoding call's audio
		// (capacity.Conversations).
		Conversation string `json:"conversation,omitempty"`
		// Pin is the pod's and the load side's CPUs (-pod-cpus).
		Pin *Pinning `json:"pin,omitempty"`
	} `json:"settings"`
	Steps   []Step  `json:"steps"`
	Summary Summary `json:"summary"`
	Error   string  `json:"error,omitempty"`
}

// WriteJSON writes the report to path, indented.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
