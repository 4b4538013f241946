// This file waits for memberlist's goroutines. memberlist's Shutdown
// returns while some of its goroutines still run: a probe in flight waits
// for its ack until the end of its (health-scaled) probe interval, up to
// AwarenessMaxMultiplier probe intervals, 40 s with WAN timings; a TCP
// connection handler waits up to TCPTimeout. memberlist offers no way to
// wait for them, so every goroutine it starts carries a pprof label
// naming its pool (goroutines inherit the labels of the goroutine that
// starts them, and memberlist starts all of its own from Create), and
// waiting means watching the goroutine profile until no goroutine with
// that label is left.

package membership

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"
)

// Goroutine label keys: every goroutine of a pool carries poolLabel, and
// groupLabel when the pool belongs to a Group.
const (
	poolLabel  = "rtcedge_membership_pool"
	groupLabel = "rtcedge_membership_group"
)

// stoppedPoll is how often a wait looks at the goroutine profile: no event
// marks the end of memberlist's goroutines, so it is polled.
const stoppedPoll = 20 * time.Millisecond

// labelSeq numbers pools and groups, so that every label value is unique in
// the process.
var labelSeq atomic.Uint64

func nextLabel(prefix string) string {
	return prefix + strconv.FormatUint(labelSeq.Add(1), 10)
}

// Group gathers pools that stop as a whole, such as every pool of a dev
// world: once all of them are closed, Wait returns when their last
// goroutine has ended. Set it in Config.Group. A Group is safe for
// concurrent use; its zero value is not usable, create it with NewGroup.
type Group struct {
	label string // static after NewGroup
}

// NewGroup returns an empty group.
func NewGroup() *Group { return &Group{label: nextLabel("g")} }

// Wait returns nil once no goroutine of any pool created with g is left,
// or an error wrapping ErrLingering naming one of them when ctx ends
// first. Pools that are not closed keep their goroutines: close them all
// before waiting.
func (g *Group) Wait(ctx context.Context) error {
	return awaitLabel(ctx, groupLabel, g.label)
}

// Wait returns nil once every goroutine of the pool has ended (after
// Close), or an error wrapping ErrLingering naming one of them when ctx
// ends first. Close returns before them: a probe in flight can outlive it
// by up to MaxLinger(cfg).
func (p *Pool) Wait(ctx context.Context) error {
	return awaitLabel(ctx, poolLabel, p.label)
}

// MaxLinger bounds how long the goroutines of a pool configured with cfg
// may run after Close: the longest health-scaled probe interval or a
// connection's TCP timeout, plus a probe timeout for an indirect probe's
// nack, plus a second of scheduling margin.
func MaxLinger(cfg Config) time.Duration {
	mc := cfg.memberlistConfig()
	probe := time.Duration(max(mc.AwarenessMaxMultiplier, 1)) * mc.ProbeInterval
	return max(probe, mc.TCPTimeout) + mc.ProbeTimeout + time.Second
}

// awaitLabel polls the goroutine profile until no goroutine carries the
// label key=value, or ctx ends.
func awaitLabel(ctx context.Context, key, value string) error {
	needle := []byte(strconv.Quote(key) + ":" + strconv.Quote(value))
	var buf bytes.Buffer
	t := time.NewTicker(stoppedPoll)
	defer t.Stop()
	for {
		buf.Reset()
		if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
			return fmt.Errorf("membership: wait for %s: goroutine profile: %w", value, err)
		}
		i := bytes.Index(buf.Bytes(), needle)
		if i < 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("membership: wait for %s: %w (%w): %s", value, ErrLingering, ctx.Err(), stackAt(buf.Bytes(), i))
		case <-t.C:
		}
	}
}

// stackAt returns the stack record of a debug=1 goroutine profile that
// holds offset i, for the error of a wait that gave up.
func stackAt(prof []byte, i int) []byte {
	start := bytes.LastIndex(prof[:i], []byte("\n\n")) + 2
	if start < 2 {
		start = 0
	}
	end := bytes.Index(prof[i:], []byte("\n\n"))
	if end < 0 {
		return prof[start:]
	}
	return prof[start : i+end]
}
