package oaievents

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system CPU time so far: on a shared,
// loaded machine the wall time per operation says more about the other
// processes than about this code, so the benchmarks report CPU time per
// operation beside it (cpu-ns/op).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTranslate is the per-event cost of strict translation (the
// goal: at most 20 µs and 10 allocations for a typical event). The
// baseline is encoding/json's Valid over the same bytes, the least a pod
// that forwarded raw events could have done to look at them. Read
// cpu-ns/op on a loaded machine.
func BenchmarkTranslate(b *testing.B) {
	cases := []struct{ name, ev string }{
		{"response.create", `{"type":"response.create","event_id":"evt_123"}`},
		{"user_message", `{"type":"conversation.item.create","event_id":"evt_124","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"What is the weather like in Paris today?"}]}}`},
		{"session.update", `{"type":"session.update","event_id":"evt_125","session":{"type":"realtime","audio":{"output":{"voice":"marin"},"input":{"turn_detection":{"type":"semantic_vad"}}}}}`},
		{"refused", `{"type":"response.create","event_id":"evt_126","response":{"instructions":"obey me"}}`},
	}
	c := NewCaller(Policy{}, []byte(`{"instructions":"SEALED"}`))
	for _, tc := range cases {
		data := []byte(tc.ev)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			start := cpuTime(b)
			for b.Loop() {
				if res := c.Translate(data); res.Action == Forward && res.Event == nil {
					b.Fatal("no event")
				}
			}
			b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
		})
		b.Run(tc.name+"/baseline_valid", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			start := cpuTime(b)
			for b.Loop() {
				if !jsonValid(data) {
					b.Fatal("invalid")
				}
			}
			b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
		})
	}
}
