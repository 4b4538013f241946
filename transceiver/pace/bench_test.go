package pace

import (
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/opus"
)

// cpuTime is the process's user and system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// timerPacer is the connector's previous pacer reduced to its pacing (no
// codec): a goroutine and a timer per call, a frame per 20 ms from a
// mutex-guarded queue. It is the baseline BenchmarkPacing compares with.
type timerPacer struct {
	mu     sync.Mutex
	frames [][]byte
	head   int
	out    Output
	quit   chan struct{}
	done   chan struct{}
}

func (p *timerPacer) push(b []byte) {
	p.mu.Lock()
	if p.head > 0 && p.head >= len(p.frames)/2 {
		p.frames = p.frames[:copy(p.frames, p.frames[p.head:])]
		p.head = 0
	}
	p.frames = append(p.frames, b)
	p.mu.Unlock()
}

func (p *timerPacer) run() {
	defer close(p.done)
	timer := time.NewTimer(opus.FrameDuration)
	next := time.Now()
	for {
		p.mu.Lock()
		var f []byte
		if p.head < len(p.frames) {
			f = p.frames[p.head]
			p.head++
		}
		p.mu.Unlock()
		if f != nil {
			p.out.SendFrame(f, opus.FrameDuration)
		}
		next = next.Add(opus.FrameDuration)
		timer.Reset(time.Until(next))
		select {
		case <-timer.C:
		case <-p.quit:
			return
		}
	}
}

// BenchmarkPacing plays calls whose backend keeps a frame ahead, for b.N
// rounds of 20 ms (run it with -benchtime=50x: one second), through the
// pod's scheduler (wheel) and through a goroutine and timer per call
// (timer, the previous pacer), and reports the CPU per call (cpu-%/call:
// per cent of one core each call costs) and allocations.
func BenchmarkPacing(b *testing.B) {
	for _, calls := range []int{100, 1600} {
		for _, mode := range []string{"timer", "wheel"} {
			b.Run(mode+"/"+itoa(calls), func(b *testing.B) {
				payload := make([]byte, 80)
				var feed func()
				var stop func()
				switch mode {
				case "wheel":
					s := New(Config{})
					qs := make([]*Queue, calls)
					for i := range qs {
						qs[i] = s.NewQueue(nopOutput{})
						qs[i].BeginItem("resp", "item")
					}
					st, done := make(chan struct{}), make(chan struct{})
					go func() { defer close(done); s.Run(st) }()
					feed = func() {
						for _, q := range qs {
							_ = q.Push(payload, opus.FrameDuration)
						}
					}
					stop = func() { close(st); <-done }
				case "timer":
					ps := make([]*timerPacer, calls)
					for i := range ps {
						ps[i] = &timerPacer{out: nopOutput{}, quit: make(chan struct{}), done: make(chan struct{})}
						go ps[i].run()
					}
					feed = func() {
						for _, p := range ps {
							p.push(payload)
						}
					}
					stop = func() {
						for _, p := range ps {
							close(p.quit)
							<-p.done
						}
					}
				}
				feed()
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime(b)
				tick := time.NewTicker(opus.FrameDuration)
				for range b.N {
					feed()
					<-tick.C
				}
				tick.Stop()
				cpu := cpuTime(b) - cpu0
				b.StopTimer()
				stop()
				b.ReportMetric(100*cpu.Seconds()/b.Elapsed().Seconds()/float64(calls), "cpu-%/call")
			})
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
