package netsim_test

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/internal/testlog"
	"github.com/rtcedge/rtcedge/netsim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger() *slog.Logger { return testlog.Logger() }

var loopback = netip.MustParseAddr("127.0.0.1")

func listenUDP(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
	if err != nil {
		t.Fatalf("listen udp: %v", err)
	}
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// startUDPLink runs a link to target until the test ends.
func startUDPLink(t testing.TB, target netip.AddrPort, up, down netsim.LinkConfig) *netsim.UDPLink {
	t.Helper()
	l, err := netsim.NewUDPLink(listenUDP(t), target, up, down, testLogger())
	if err != nil {
		t.Fatalf("new link: %v", err)
	}
	runLink(t, l)
	return l
}

// since is the clock shared by senders and the target: time since base, so
// a one-way delay is a plain subtraction within this process.
var base = time.Now()

func since() time.Duration { return time.Since(base) }

// reflector is a UDP target that stamps each datagram with its arrival time
// and sends it back: payload = seq(4) | sent(8) | reflected(8).
type reflector struct {
	conn *net.UDPConn
	got  atomic.Int64
	mu   sync.Mutex
	srcs map[netip.AddrPort]int
	wg   sync.WaitGroup
}

func startReflector(t testing.TB) *reflector {
	t.Helper()
	r := &reflector{conn: listenUDP(t), srcs: map[netip.AddrPort]int{}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := r.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			r.got.Add(1)
			r.mu.Lock()
			r.srcs[from]++
			r.mu.Unlock()
			if n >= 20 {
				binary.BigEndian.PutUint64(buf[12:], uint64(since()))
			}
			_, _ = r.conn.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	t.Cleanup(func() { r.conn.Close(); r.wg.Wait() })
	return r
}

func (r *reflector) sources() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.srcs)
}

// sample is one datagram's trip through the link and back.
type sample struct {
	seq      uint32
	up, down time.Duration
}

// client sends stamped datagrams to a link and reads the reflections.
type client struct {
	conn *net.UDPConn
	to   netip.AddrPort
}

func newClient(t testing.TB, to netip.AddrPort) *client {
	t.Helper()
	c := &client{conn: listenUDP(t), to: to}
	t.Cleanup(func() { c.conn.Close() })
	return c
}

func (c *client) send(t testing.TB, seq uint32) {
	t.Helper()
	var b [20]byte
	binary.BigEndian.PutUint32(b[:], seq)
	binary.BigEndian.PutUint64(b[4:], uint64(since()))
	if _, err := c.conn.WriteToUDPAddrPort(b[:], c.to); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// collect reads reflections until want arrived or the deadline passed.
// sendAll sends datagrams 0..n-1 a millisecond apart and returns all n
// as they came back (within 10 s), or fails the test.
func (c *client) sendAll(t testing.TB, n int) []sample {
	t.Helper()
	var got []sample
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); got = c.collect(n, time.Now().Add(10*time.Second)) }()
	tick := time.NewTicker(time.Millisecond)
	for i := range n {
		<-tick.C
		c.send(t, uint32(i))
	}
	tick.Stop()
	wg.Wait()
	if len(got) != n {
		t.Fatalf("got %d of %d datagrams back", len(got), n)
	}
	return got
}

func (c *client) collect(want int, deadline time.Time) []sample {
	var out []sample
	buf := make([]byte, 2048)
	_ = c.conn.SetReadDeadline(deadline)
	for len(out) < want {
		n, err := c.conn.Read(buf)
		if err != nil {
			break
		}
		if n < 20 {
			continue
		}
		now := since()
		sent := time.Duration(binary.BigEndian.Uint64(buf[4:]))
		refl := time.Duration(binary.BigEndian.Uint64(buf[12:]))
		out = append(out, sample{seq: binary.BigEndian.Uint32(buf), up: refl - sent, down: now - refl})
	}
	return out
}

// eventually polls cond every 5 ms until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func summarise(ds []time.Duration, configured time.Duration) (mean, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return sum/time.Duration(len(s)) - configured, s[(len(s)*99)/100] - configured
}

// TestUDPLinkDelay measures one-way delays through the link in each
// direction. Timers never fire early, so every sample is at least the
// configured delay; how close the mean comes is logged, not asserted.
func TestUDPLinkDelay(t *testing.T) {
	tests := []struct {
		name     string
		up, down time.Duration
	}{
		{"none", 0, 0},
		{"symmetric 10ms", 10 * time.Millisecond, 10 * time.Millisecond},
		{"asymmetric 25ms/5ms", 25 * time.Millisecond, 5 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := startReflector(t)
			l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{Delay: tt.up}, netsim.LinkConfig{Delay: tt.down})
			c := newClient(t, l.Addr())
			const n = 200
			got := c.sendAll(t, n)
			var ups, downs []time.Duration
			for i, s := range got {
				if s.seq != uint32(i) {
					t.Fatalf("datagram %d arrived as number %d: a link without jitter must keep order", s.seq, i)
				}
				if s.up < tt.up || s.down < tt.down {
					t.Fatalf("datagram %d: up %v (configured %v), down %v (configured %v): left before it was due", s.seq, s.up, tt.up, s.down, tt.down)
				}
				ups, downs = append(ups, s.up), append(downs, s.down)
			}
			upMean, upP99 := summarise(ups, tt.up)
			dnMean, dnP99 := summarise(downs, tt.down)
			t.Logf("up %v: error mean %v p99 %v; down %v: error mean %v p99 %v", tt.up, upMean, upP99, tt.down, dnMean, dnP99)
			// A gross bound only, to catch unit mistakes, not a timing goal.
			if upMean > time.Second || dnMean > time.Second {
				t.Errorf("mean delay error above a second")
			}
		})
	}
}

// TestUDPLinkJitter checks that jitter spreads arrivals over the configured
// window and reorders closely spaced datagrams, never below Delay-Jitter.
func TestUDPLinkJitter(t *testing.T) {
	r := startReflector(t)
	cfg := netsim.LinkConfig{Delay: 20 * time.Millisecond, Jitter: 10 * time.Millisecond, Seed: 7}
	l := startUDPLink(t, addrOf(r.conn), cfg, netsim.LinkConfig{})
	c := newClient(t, l.Addr())
	const n = 300
	got := c.sendAll(t, n)
	lo, hi, reordered := time.Hour, time.Duration(0), 0
	for i, s := range got {
		lo, hi = min(lo, s.up), max(hi, s.up)
		if i > 0 && s.seq < got[i-1].seq {
			reordered++
		}
	}
	t.Logf("one-way delay with 20ms ± 10ms: min %v max %v, %d of %d arrived out of order", lo, hi, reordered, n)
	if lo < cfg.Delay-cfg.Jitter {
		t.Errorf("min delay %v below Delay-Jitter", lo)
	}
	if hi-lo < cfg.Jitter/2 {
		t.Errorf("delays spread over only %v, want about %v", hi-lo, 2*cfg.Jitter)
	}
	if reordered == 0 {
		t.Errorf("no reordering with jitter 10ms at 1ms spacing")
	}
}

// sendPaced sends n datagrams in bursts, waiting after each burst until the
// link has taken them all, so no socket buffer overflows and every datagram
// meets the link's loss draw.
func sendPaced(t *testing.T, c *client, l *netsim.UDPLink, n int) {
	t.Helper()
	seen := func() uint64 {
		s := l.Stats().Up
		return s.Forwarded + s.DroppedTotal() + uint64(s.Queued)
	}
	start := seen()
	for i := 0; i < n; {
		for j := 0; j < 50 && i < n; j++ {
			c.send(t, uint32(i))
			i++
		}
		eventually(t, 5*time.Second, "the link to take the burst", func() bool { return seen()-start >= uint64(i) })
	}
}

// TestUDPLinkLoss drops about the configured share of datagrams.
func TestUDPLinkLoss(t *testing.T) {
	tests := []struct {
		name string
		loss float64
	}{
		{"none", 0},
		{"5%", 0.05},
		{"30%", 0.3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := startReflector(t)
			l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{Loss: tt.loss, Seed: 1}, netsim.LinkConfig{})
			c := newClient(t, l.Addr())
			const n = 2000
			sendPaced(t, c, l, n)
			eventually(t, 5*time.Second, "the target to get every forwarded datagram", func() bool {
				st := l.Stats().Up
				return st.Queued == 0 && uint64(r.got.Load()) == st.Forwarded
			})
			st := l.Stats().Up
			ratio := float64(st.Dropped[netsim.DropLoss]) / n
			t.Logf("configured loss %.2f, measured %.4f over %d datagrams (%d reached the target)", tt.loss, ratio, n, r.got.Load())
			if st.Forwarded+st.Dropped[netsim.DropLoss] != n {
				t.Errorf("forwarded %d + lost %d != sent %d (stats %+v)", st.Forwarded, st.Dropped[netsim.DropLoss], n, st)
			}
			// ±0.05 is about five standard deviations at n=2000.
			if ratio < tt.loss-0.05 || ratio > tt.loss+0.05 {
				t.Errorf("loss ratio %.4f, configured %.2f", ratio, tt.loss)
			}
		})
	}
}

// TestUDPLinkSetLoss switches loss on and off at run time.
func TestUDPLinkSetLoss(t *testing.T) {
	r := startReflector(t)
	l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{}, netsim.LinkConfig{})
	c := newClient(t, l.Addr())
	l.SetLoss(1, 0)
	sendPaced(t, c, l, 100)
	if st := l.Stats().Up; st.Dropped[netsim.DropLoss] != 100 || st.Forwarded != 0 {
		t.Fatalf("with loss 1: %+v", st)
	}
	l.SetLoss(0, 0)
	sendPaced(t, c, l, 100)
	// The link has taken every datagram; some may still wait in its
	// queue for the scheduler.
	eventually(t, 5*time.Second, "the link to forward the second hundred", func() bool { return l.Stats().Up.Queued == 0 })
	if st := l.Stats().Up; st.Forwarded != 100 || st.Dropped[netsim.DropLoss] != 100 {
		t.Fatalf("with loss 0 again: %+v", st)
	}
}

// TestUDPLinkPartition drops everything both ways while partitioned and
// forwards again once healed.
func TestUDPLinkPartition(t *testing.T) {
	r := startReflector(t)
	l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{Delay: 2 * time.Millisecond}, netsim.LinkConfig{Delay: 2 * time.Millisecond})
	c := newClient(t, l.Addr())
	roundTrip := func(seq uint32) bool {
		c.send(t, seq)
		return len(c.collect(1, time.Now().Add(2*time.Second))) == 1
	}
	if !roundTrip(1) {
		t.Fatal("no reply before the partition")
	}
	l.SetPartitioned(true)
	sendPaced(t, c, l, 50)
	if st := l.Stats(); st.Up.Dropped[netsim.DropPartition] != 50 || st.Up.Forwarded != 1 {
		t.Fatalf("while partitioned: %+v", st.Up)
	}
	if got := r.got.Load(); got != 1 {
		t.Fatalf("target got %d datagrams, want only the one before the partition", got)
	}
	l.SetPartitioned(false)
	if !roundTrip(2) {
		t.Fatal("no reply after healing")
	}
}

// TestUDPLinkPartitionInFlight drops the replies already queued when the
// partition starts: nothing crosses, in either direction.
func TestUDPLinkPartitionInFlight(t *testing.T) {
	r := startReflector(t)
	l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{}, netsim.LinkConfig{Delay: 300 * time.Millisecond})
	c := newClient(t, l.Addr())
	c.send(t, 1)
	eventually(t, 5*time.Second, "the reply to queue", func() bool { return l.Stats().Down.Queued == 1 })
	l.SetPartitioned(true)
	eventually(t, 5*time.Second, "the queued reply to be dropped", func() bool {
		return l.Stats().Down.Dropped[netsim.DropPartition] == 1
	})
	if st := l.Stats().Down; st.Forwarded != 0 {
		t.Fatalf("down: %+v", st)
	}
}

// TestUDPLinkFlows gives each client its own upstream socket, and replies
// reach the client that sent.
func TestUDPLinkFlows(t *testing.T) {
	r := startReflector(t)
	l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{}, netsim.LinkConfig{})
	const clients = 5
	for i := range clients {
		c := newClient(t, l.Addr())
		c.send(t, uint32(i))
		got := c.collect(1, time.Now().Add(2*time.Second))
		if len(got) != 1 || got[0].seq != uint32(i) {
			t.Fatalf("client %d got %+v", i, got)
		}
	}
	if n := r.sources(); n != clients {
		t.Errorf("target saw %d sources, want %d", n, clients)
	}
	if n := l.Stats().Flows; n != clients {
		t.Errorf("link has %d flows, want %d", n, clients)
	}
}

// TestUDPLinkQueueFull drops arrivals beyond the queue bound.
func TestUDPLinkQueueFull(t *testing.T) {
	r := startReflector(t)
	l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{Delay: time.Hour, Queue: 4}, netsim.LinkConfig{})
	c := newClient(t, l.Addr())
	sendPaced(t, c, l, 20)
	st := l.Stats().Up
	if st.Queued != 4 || st.Dropped[netsim.DropQueueFull] != 16 {
		t.Errorf("queue 4, 20 sent: %+v", st)
	}
}

func TestLinkConfigValidate(t *testing.T) {
	tests := []struct {
		cfg netsim.LinkConfig
		ok  bool
	}{
		{netsim.LinkConfig{}, true},
		{netsim.LinkConfig{Delay: time.Millisecond, Jitter: time.Millisecond, Loss: 1}, true},
		{netsim.LinkConfig{Delay: -1}, false},
		{netsim.LinkConfig{Jitter: -1}, false},
		{netsim.LinkConfig{Loss: 1.5}, false},
		{netsim.LinkConfig{Loss: -0.1}, false},
		{netsim.LinkConfig{Queue: -1}, false},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v: Validate = %v", tt.cfg, err)
		}
	}
}

// TestUDPLinkClose returns from Run on Close as well as on ctx.
func TestUDPLinkClose(t *testing.T) {
	r := startReflector(t)
	l, err := netsim.NewUDPLink(listenUDP(t), addrOf(r.conn), netsim.LinkConfig{}, netsim.LinkConfig{}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(context.Background()) }()
	c := newClient(t, l.Addr())
	c.send(t, 1)
	if len(c.collect(1, time.Now().Add(2*time.Second))) != 1 {
		t.Fatal("no reply")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestUDPLinkSetExtraDelay: a degraded path delays every datagram sent
// after the change by the extra each way; healing (0) restores the
// configured delay.
func TestUDPLinkSetExtraDelay(t *testing.T) {
	const base, extra = 5 * time.Millisecond, 30 * time.Millisecond
	r := startReflector(t)
	l := startUDPLink(t, addrOf(r.conn), netsim.LinkConfig{Delay: base}, netsim.LinkConfig{Delay: base})
	c := newClient(t, l.Addr())
	l.SetExtraDelay(extra)
	for _, s := range c.sendAll(t, 20) {
		if s.up < base+extra || s.down < base+extra {
			t.Fatalf("degraded: datagram %d up %v down %v, want at least %v each way", s.seq, s.up, s.down, base+extra)
		}
	}
	l.SetExtraDelay(0)
	var ups []time.Duration
	for _, s := range c.sendAll(t, 20) {
		ups = append(ups, s.up)
	}
	if mean, _ := summarise(ups, base); mean >= extra {
		t.Errorf("healed: mean up delay %v over the configured %v", mean+base, base)
	}
}
