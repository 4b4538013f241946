package netsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Flow limits of a UDPLink.
const (
	// FlowIdle is how long a client flow (and its upstream socket) lives
	// without traffic either way. Longer than the relays' own flow expiry,
	// so the link never forgets a client before the relay does.
	FlowIdle = 2 * time.Minute
	// MaxFlows bounds the upstream sockets of one link.
	MaxFlows = 4096
)

// UDPLink listens on one socket and forwards every datagram to a target;
// the target's replies go back to the sender. Each direction has its own
// LinkConfig. The link opens one upstream socket per client address, like a
// NAT, so the target sees distinct sources and replies reach the right
// client.
type UDPLink struct {
	// Static after construction.
	listen    *net.UDPConn
	target    netip.AddrPort
	bindAddr  netip.Addr // local address of upstream sockets
	log       *slog.Logger
	up, down  *delayLine
	partition atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
	epoch     time.Time

	mu     sync.Mutex
	flows  map[netip.AddrPort]*udpFlow // guarded by mu
	closed bool                        // guarded by mu

	wg sync.WaitGroup // flow readers, the two delay lines, the janitor
}

// udpFlow is one client's path through the link.
type udpFlow struct {
	client netip.AddrPort
	conn   *net.UDPConn // connected to the target
	last   atomic.Int64 // last traffic, nanoseconds since the link's epoch
	closed atomic.Bool
}

// NewUDPLink returns a link that forwards datagrams arriving on listen to
// target, delayed by up, and the target's replies back, delayed by down.
// The link owns listen from now on and closes it in Close. Upstream sockets
// bind to the loopback address when target is on loopback, so a test or
// simulation opens no socket on any other interface.
func NewUDPLink(listen *net.UDPConn, target netip.AddrPort, up, down LinkConfig, log *slog.Logger) (*UDPLink, error) {
	if err := up.Validate(); err != nil {
		return nil, fmt.Errorf("up: %w", err)
	}
	if err := down.Validate(); err != nil {
		return nil, fmt.Errorf("down: %w", err)
	}
	if !target.IsValid() || target.Port() == 0 {
		return nil, fmt.Errorf("netsim: invalid target %v", target)
	}
	if log == nil {
		log = slog.Default()
	}
	target = netip.AddrPortFrom(target.Addr().Unmap(), target.Port())
	l := &UDPLink{
		listen: listen, target: target, log: log.With("component", "netsim", "link", "udp", "target", target.String()),
		done: make(chan struct{}), flows: map[netip.AddrPort]*udpFlow{}, epoch: time.Now(),
	}
	switch {
	case target.Addr().Is4() && target.Addr().IsLoopback():
		l.bindAddr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	case target.Addr().IsLoopback():
		l.bindAddr = netip.IPv6Loopback()
	}
	l.up = newDelayLine(up, 1, &l.partition, func(p *packet) error {
		_, err := p.flow.conn.Write((*p.buf)[:p.n])
		return err
	})
	l.down = newDelayLine(down, 2, &l.partition, func(p *packet) error {
		_, err := l.listen.WriteToUDPAddrPort((*p.buf)[:p.n], p.flow.client)
		return err
	})
	return l, nil
}

// Addr is the address clients send to.
func (l *UDPLink) Addr() netip.AddrPort { return l.listen.LocalAddr().(*net.UDPAddr).AddrPort() }

// SetPartitioned cuts the link both ways (true) or heals it (false). While
// cut, every datagram is dropped, including those already in flight.
func (l *UDPLink) SetPartitioned(on bool) { l.partition.Store(on) }

// SetLoss changes the loss ratio of each direction.
func (l *UDPLink) SetLoss(up, down float64) {
	l.up.setLoss(up)
	l.down.setLoss(down)
}

// SetExtraDelay degrades (or, with 0, heals) the path: every datagram that
// arrives from now on waits extra more, each way, on top of the
// configured delay. Datagrams already queued keep their due time.
func (l *UDPLink) SetExtraDelay(extra time.Duration) {
	l.up.setExtra(extra)
	l.down.setExtra(extra)
}

// UDPStats is a snapshot of a UDPLink's counters.
type UDPStats struct {
	Up, Down DirectionStats
	Flows    int // live client flows
}

// Stats returns the link's counters.
func (l *UDPLink) Stats() UDPStats {
	l.mu.Lock()
	n := len(l.flows)
	l.mu.Unlock()
	return UDPStats{Up: l.up.stats(), Down: l.down.stats(), Flows: n}
}

// Run forwards until ctx ends or Close is called, and returns nil then. It
// must be called once.
func (l *UDPLink) Run(ctx context.Context) error {
	l.wg.Add(3)
	go func() { defer l.wg.Done(); l.up.run(l.done) }()
	go func() { defer l.wg.Done(); l.down.run(l.done) }()
	go func() { defer l.wg.Done(); l.expire() }()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	err := l.readClients()
	l.Close()
	l.wg.Wait()
	return err
}

// Close stops the link and closes every socket it owns. Idempotent.
func (l *UDPLink) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.listen.Close()
		l.mu.Lock()
		l.closed = true
		for _, f := range l.flows {
			f.close()
		}
		clear(l.flows)
		l.mu.Unlock()
	})
	return err
}

func (l *UDPLink) now() int64 { return int64(time.Since(l.epoch)) }

// readClients is the one reader of the listening socket.
func (l *UDPLink) readClients() error {
	for {
		buf := getBuf()
		n, _, flags, from, err := l.listen.ReadMsgUDPAddrPort(*buf, nil)
		if err != nil {
			putBuf(buf)
			select {
			case <-l.done:
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("netsim: read from clients: %w", err)
		}
		if flags&syscall.MSG_TRUNC != 0 {
			l.up.drop(DropOversize)
			putBuf(buf)
			continue
		}
		f := l.flow(netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
		if f == nil {
			l.up.drop(DropFlowLimit)
			putBuf(buf)
			continue
		}
		f.last.Store(l.now())
		l.up.push(buf, n, f)
	}
}

// flow returns the client's flow, opening its upstream socket on first
// sight; nil when no flow can be had (limit, closing, socket error).
func (l *UDPLink) flow(client netip.AddrPort) *udpFlow {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.flows[client]; ok {
		return f
	}
	if l.closed || len(l.flows) >= MaxFlows {
		return nil
	}
	var laddr *net.UDPAddr
	if l.bindAddr.IsValid() {
		laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.bindAddr, 0))
	}
	conn, err := net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(l.target))
	if err != nil {
		l.log.Warn("open upstream socket", "client", client.String(), "err", err)
		return nil
	}
	f := &udpFlow{client: client, conn: conn}
	f.last.Store(l.now())
	l.flows[client] = f
	l.wg.Add(1)
	go l.readTarget(f)
	return f
}

// readTarget is the one reader of a flow's upstream socket.
func (l *UDPLink) readTarget(f *udpFlow) {
	defer l.wg.Done()
	for {
		buf := getBuf()
		n, _, flags, _, err := f.conn.ReadMsgUDPAddrPort(*buf, nil)
		if err != nil {
			putBuf(buf)
			if f.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// A connected UDP socket reports an earlier ICMP error (the
			// target not listening yet) on the next read; the flow lives on.
			continue
		}
		if flags&syscall.MSG_TRUNC != 0 {
			l.down.drop(DropOversize)
			putBuf(buf)
			continue
		}
		f.last.Store(l.now())
		l.down.push(buf, n, f)
	}
}

func (f *udpFlow) close() {
	if f.closed.CompareAndSwap(false, true) {
		f.conn.Close()
	}
}

// expire closes flows idle for FlowIdle.
func (l *UDPLink) expire() {
	tick := time.NewTicker(FlowIdle / 4)
	defer tick.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-tick.C:
		}
		cutoff := l.now() - int64(FlowIdle)
		l.mu.Lock()
		for c, f := range l.flows {
			if f.last.Load() < cutoff {
				f.close()
				delete(l.flows, c)
			}
		}
		l.mu.Unlock()
	}
}
