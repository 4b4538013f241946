package capacity

import (
	"context"
	"testing"
	"time"
)

// TestRunPhone runs the phone-call generator end to end at 3 calls per
// mode: the pod hears the callers (through the token each call's route
// entry gives), the reference server gets their audio and the carriers
// get its replies; passthrough calls are counted as such, transcoded ones
// not; each process's CPU is read.
func TestRunPhone(t *testing.T) {
	bin := buildRTCEdge(t)
	for _, pass := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		steps, err := RunPhone(ctx, PhoneConfig{Bin: bin, Dir: t.TempDir(), Steps: []int{3}, Passthrough: pass,
			Settle: time.Second, Window: 5 * time.Second})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		st := steps[0]
		t.Logf("passthrough %v: %s", pass, st.line())
		if st.Calls != 3 || st.SetupFailures != 0 {
			t.Errorf("%d calls, %d setup failures", st.Calls, st.SetupFailures)
		}
		if st.Heard < 0.9 || st.ToBackend < 0.5 || st.Received <= 0 {
			t.Errorf("heard %.2f, to the server %.2f, replies received %.2f s/s per call", st.Heard, st.ToBackend, st.Received)
		}
		if want := map[bool]float64{true: 3, false: 0}[pass]; st.Passthrough != want {
			t.Errorf("%v passthrough calls, want %v", st.Passthrough, want)
		}
		if st.PodCPU <= 0 || st.RefCPU <= 0 || st.GenCPU <= 0 {
			t.Errorf("CPU: pod %.3f, reference server %.3f, generator %.3f: want each read", st.PodCPU, st.RefCPU, st.GenCPU)
		}
	}
}
