// Tests of the world's start-up wait for gossip (awaitProgress), on a
// fake clock.
package devworld

import (
	"strings"
	"testing"
	"time"
)

// fakeClock advances only when slept on.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time                   { return c.t }
func (c *fakeClock) sleep(d time.Duration)            { c.t = c.t.Add(d) }
func (c *fakeClock) since(t0 time.Time) time.Duration { return c.t.Sub(t0) }

// TestAwaitProgress: a convergence that keeps learning members waits past
// the stall limit, up to the overall limit; one that stops learning (or
// loses and finds the same member again) fails once the stall limit
// passes; a complete one returns at once.
func TestAwaitProgress(t *testing.T) {
	const stall, limit = time.Second, 6 * time.Second
	for _, tc := range []struct {
		name    string
		known   func(at time.Duration) int // what gossip has told the world by then
		total   int
		wantErr string        // "" = converged
		wantAt  time.Duration // when awaitProgress returned, within a poll
	}{
		{name: "converged", known: func(time.Duration) int { return 4 }, total: 4, wantAt: 0},
		{name: "a member every 0.9 s, 3.6 s in all", total: 4,
			known:  func(at time.Duration) int { return min(4, int(at/(900*time.Millisecond))) },
			wantAt: 3600 * time.Millisecond},
		{name: "stuck", total: 4, known: func(at time.Duration) int { return min(2, int(at/(100*time.Millisecond))) },
			wantErr: "without progress", wantAt: 1200 * time.Millisecond},
		{name: "flapping", total: 4, known: func(at time.Duration) int { return 2 + int(at/(300*time.Millisecond))%2 },
			wantErr: "without progress", wantAt: 1300 * time.Millisecond},
		{name: "progressing past the limit", total: 100, known: func(at time.Duration) int { return int(at / (500 * time.Millisecond)) },
			wantErr: "in all", wantAt: limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeClock{t: time.Unix(0, 0)}
			t0 := c.now()
			check := func() ([]string, int) {
				n := tc.known(c.since(t0))
				if n >= tc.total {
					return nil, n
				}
				return []string{"a member missing"}, n
			}
			err := awaitProgress(check, stall, limit, c.now, c.sleep)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("err %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err %v, want one saying %q", err, tc.wantErr)
			}
			if got := c.since(t0); got < tc.wantAt || got > tc.wantAt+40*time.Millisecond {
				t.Errorf("returned after %v, want %v", got, tc.wantAt)
			}
		})
	}
}
