package probe

import (
	"math"
	"slices"
	"sync"
	"time"
)

// AudioStats summarises a call's echoed audio.
type AudioStats struct {
	Sent       int
	Received   int
	Lost       int             // sent more than a second ago and never echoed
	RTTs       []time.Duration // every measured round trip, in arrival order
	Jitter     time.Duration   // RFC 3550-style smoothed RTT variation
	LastArrive time.Duration   // since call start, of the latest echo
}

// Percentile returns the p-th percentile (0..100) of the RTTs, or 0.
func (s AudioStats) Percentile(p float64) time.Duration {
	if len(s.RTTs) == 0 {
		return 0
	}
	r := slices.Clone(s.RTTs)
	slices.Sort(r)
	i := int(math.Ceil(p/100*float64(len(r)))) - 1
	return r[max(0, min(i, len(r)-1))]
}

// LossRatio returns lost/sent, counting only packets old enough to judge.
func (s AudioStats) LossRatio() float64 {
	if s.Sent == 0 {
		return 0
	}
	return float64(s.Lost) / float64(s.Sent)
}

type rttStats struct {
	mu       sync.Mutex
	sentAt   map[uint32]time.Time
	got      map[uint32]bool
	sentN    int
	recvN    int
	rtts     []time.Duration
	jitter   float64
	lastRTT  time.Duration
	arrivals []time.Duration
}

func (r *rttStats) sent(seq uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sentAt == nil {
		r.sentAt = map[uint32]time.Time{}
		r.got = map[uint32]bool{}
	}
	r.sentAt[seq] = time.Now()
	r.sentN++
}

func (r *rttStats) received(seq uint32, at, rtt time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = map[uint32]bool{}
	}
	if r.got[seq] {
		return
	}
	r.got[seq] = true
	r.recvN++
	if r.lastRTT != 0 {
		d := math.Abs(float64(rtt - r.lastRTT))
		r.jitter += (d - r.jitter) / 16
	}
	r.lastRTT = rtt
	r.rtts = append(r.rtts, rtt)
	r.arrivals = append(r.arrivals, at)
}

func (r *rttStats) snapshot() AudioStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := AudioStats{Sent: r.sentN, Received: r.recvN, RTTs: slices.Clone(r.rtts), Jitter: time.Duration(r.jitter)}
	cutoff := time.Now().Add(-time.Second)
	for seq, t := range r.sentAt {
		if t.Before(cutoff) && !r.got[seq] {
			s.Lost++
		}
	}
	if n := len(r.arrivals); n > 0 {
		s.LastArrive = r.arrivals[n-1]
	}
	return s
}

// Gaps returns the longest interval between consecutive echo arrivals and
// when it ended (since call start): how long audio stopped during a fault.
func (c *Call) Gaps() (longest, endedAt time.Duration) {
	c.stats.mu.Lock()
	defer c.stats.mu.Unlock()
	a := c.stats.arrivals
	for i := 1; i < len(a); i++ {
		if d := a[i] - a[i-1]; d > longest {
			longest, endedAt = d, a[i]
		}
	}
	return longest, endedAt
}

// Gap is one interval without echoed audio, in wall-clock time.
type Gap struct{ Start, End time.Time }

// GapsOver returns every interval between consecutive echo arrivals
// longer than min, oldest first.
func (c *Call) GapsOver(min time.Duration) []Gap {
	c.stats.mu.Lock()
	defer c.stats.mu.Unlock()
	var gs []Gap
	a := c.stats.arrivals
	for i := 1; i < len(a); i++ {
		if a[i]-a[i-1] > min {
			gs = append(gs, Gap{Start: c.start.Add(a[i-1]), End: c.start.Add(a[i])})
		}
	}
	return gs
}

// liveStats is a constant-time view of a running call, for progress lines
// that must not copy every sample of every call each second.
type liveStats struct {
	sent, received  int
	lastRTT, jitter time.Duration
}

func (r *rttStats) live() liveStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return liveStats{sent: r.sentN, received: r.recvN, lastRTT: r.lastRTT, jitter: time.Duration(r.jitter)}
}
