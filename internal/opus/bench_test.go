//go:build cgo && !noopus

package opus

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/internal/audiotest"
)

// threadCPU is the calling thread's CPU time: on a shared machine it
// counts what the codec costs, not the time other processes held the core.
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// callerPackets is espeak-ng speech as a caller's browser sends it: 48 kHz
// Opus in 20 ms packets (NewVoIPEncoder: VOIP, 32 kb/s, FEC, complexity 9).
func callerPackets(b *testing.B) [][]byte {
	b.Helper()
	s := audiotest.Speech(b, speechText, 48000)
	enc, err := NewVoIPEncoder(48000)
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	var pkts [][]byte
	buf := make([]byte, MaxPacket)
	for i := 0; i+960 <= len(s); i += 960 {
		n, err := enc.Encode(s[i:i+960], buf)
		if err != nil {
			b.Fatal(err)
		}
		pkts = append(pkts, append([]byte(nil), buf[:n]...))
	}
	return pkts
}

// BenchmarkEdgeFrame is the edge's audio work for one 20 ms frame of a
// call, both directions: decode the caller's 48 kHz Opus packet to PCM at
// the backend's rate, and encode the backend's 20 ms of PCM (speech) to
// Opus. Besides ns/op it reports each frame's wall time at p50 and p99,
// and its thread CPU time at p50 and p99 and on average (cpu-ns/op): on a
// shared machine the wall time's tail is the scheduler's (the thread
// preempted for milliseconds), the CPU time's is the codec's.
func BenchmarkEdgeFrame(b *testing.B) {
	pkts := callerPackets(b)
	for _, rate := range []int{24000, 16000} {
		speech := audiotest.Speech(b, speechText, rate)
		b.Run(fmt.Sprint(rate), func(b *testing.B) {
			enc, dec := newPair(b, rate, rate)
			pcm, out := make([]int16, rate*120/1000), make([]byte, MaxPacket)
			fs := enc.FrameSamples()
			frames := len(speech) / fs
			lat, cpus := make([]time.Duration, b.N), make([]time.Duration, b.N)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := threadCPU()
			for i := range b.N {
				t0, c0 := time.Now(), threadCPU()
				if _, err := dec.Decode(pkts[i%len(pkts)], pcm); err != nil {
					b.Fatal(err)
				}
				j := (i % frames) * fs
				if _, err := enc.Encode(speech[j:j+fs], out); err != nil {
					b.Fatal(err)
				}
				lat[i], cpus[i] = time.Since(t0), threadCPU()-c0
			}
			cpu := threadCPU() - cpu0
			b.StopTimer()
			slices.Sort(lat)
			slices.Sort(cpus)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns/frame")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns/frame")
			b.ReportMetric(float64(cpus[len(cpus)/2].Nanoseconds()), "p50-cpu-ns/frame")
			b.ReportMetric(float64(cpus[len(cpus)*99/100].Nanoseconds()), "p99-cpu-ns/frame")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkDecode: one caller packet to PCM at each backend rate.
func BenchmarkDecode(b *testing.B) {
	pkts := callerPackets(b)
	for _, rate := range []int{48000, 24000, 16000} {
		b.Run(fmt.Sprint(rate), func(b *testing.B) {
			dec, err := NewDecoder(rate)
			if err != nil {
				b.Fatal(err)
			}
			defer dec.Close()
			pcm := make([]int16, rate*120/1000)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := threadCPU()
			for i := range b.N {
				if _, err := dec.Decode(pkts[i%len(pkts)], pcm); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((threadCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkEncode: 20 ms of 24 kHz speech to Opus by the edge's encoder
// (NewEncoder, CELT) at the complexities docs/benchmarks.md compares
// (DefaultComplexity is NewEncoder's), and by a browser's (NewVoIPEncoder,
// SILK/CELT hybrid) at complexity 1, the edge's encoder before it used CELT.
func BenchmarkEncode(b *testing.B) {
	speech := audiotest.Speech(b, speechText, 24000)
	type variant struct {
		name   string
		newEnc func(int) (*Encoder, error)
		c      int
	}
	var vs []variant
	for _, c := range []int{0, 1, 3, 5, 10} {
		vs = append(vs, variant{fmt.Sprintf("edge/complexity=%d", c), NewEncoder, c})
	}
	vs = append(vs, variant{"voip/complexity=1", NewVoIPEncoder, 1})
	for _, v := range vs {
		b.Run(v.name, func(b *testing.B) {
			enc, err := v.newEnc(24000)
			if err != nil {
				b.Fatal(err)
			}
			defer enc.Close()
			if err := enc.SetComplexity(v.c); err != nil {
				b.Fatal(err)
			}
			out := make([]byte, MaxPacket)
			fs := enc.FrameSamples()
			frames := len(speech) / fs
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := threadCPU()
			for i := range b.N {
				j := (i % frames) * fs
				if _, err := enc.Encode(speech[j:j+fs], out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((threadCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
