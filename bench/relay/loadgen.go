package relay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/token"
)

// Payload layout of a load datagram (payloadLen bytes, RTP-like first
// byte so that every tier treats it as media): [8:16] send time in ns since
// the generator's epoch, [16:20] flow index, [20:24] payloadMagic, [24:28]
// the generator's ID (a late echo of an earlier attempt, whose sockets had
// the same ports, is ignored rather than counted as stray).
const (
	payloadLen   = 120
	payloadMagic = 0x52424e43
)

// histBuckets is the RTT histogram's range in microseconds; later echoes
// land in the last bucket.
const histBuckets = 50_000

// gen is the load generator of one trial: flows UDP sockets (one client
// address each), one sender goroutine pacing every flow's datagrams
// evenly, one reader per flow.
type gen struct {
	flows []*net.UDPConn
	epoch time.Time
	id    uint32

	// The window: datagrams sent in [winStart, winEnd) (ns since epoch)
	// are counted, and so are their echoes whenever they arrive.
	winStart, winEnd atomic.Int64
	sent, recv       atomic.Int64
	stray            atomic.Int64 // echoes on the wrong flow or malformed
	hist             [histBuckets]atomic.Uint32

	wg sync.WaitGroup
}

// newGen opens n client sockets on bind.
func newGen(n int, bind netip.Addr) (*gen, error) {
	g := &gen{epoch: time.Now(), id: uint32(time.Now().UnixNano())}
	g.winStart.Store(1 << 62)
	for range n {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(bind, 0)))
		if err != nil {
			g.close()
			return nil, fmt.Errorf("load generator socket: %w", err)
		}
		_ = c.SetReadBuffer(1 << 20)
		g.flows = append(g.flows, c)
	}
	return g, nil
}

// setup sends every flow's first datagram (a STUN Binding Request with a
// routing token for the global relay, when keys is set) and waits for its
// echo, so that flows exist before the load starts.
func (g *gen) setup(target netip.AddrPort, keys *token.Keyring) error {
	if keys == nil {
		return nil
	}
	buf := make([]byte, 2048)
	for i, c := range g.flows {
		ufrag, err := keys.Mint(benchCluster, benchPod)
		if err != nil {
			return err
		}
		m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(ufrag+":load"),
			stun.NewShortTermIntegrity("load-generator-password"), stun.Fingerprint)
		if err != nil {
			return err
		}
		ok := false
		for try := 0; try < 5 && !ok; try++ {
			if _, err := c.WriteToUDPAddrPort(m.Raw, target); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			n, _, err := c.ReadFromUDPAddrPort(buf)
			ok = err == nil && stun.IsMessage(buf[:n])
		}
		if !ok {
			return fmt.Errorf("flow %d: no answer to its binding request", i)
		}
	}
	for _, c := range g.flows {
		_ = c.SetReadDeadline(time.Time{})
	}
	return nil
}

// start launches the readers.
func (g *gen) start() {
	for i, c := range g.flows {
		g.wg.Add(1)
		go g.read(i, c)
	}
}

func (g *gen) read(idx int, c *net.UDPConn) {
	defer g.wg.Done()
	buf := make([]byte, 2048)
	for {
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		now := time.Since(g.epoch).Nanoseconds()
		if n == payloadLen && binary.BigEndian.Uint32(buf[20:24]) == payloadMagic && binary.BigEndian.Uint32(buf[24:28]) != g.id {
			continue // an earlier attempt's
		}
		if n != payloadLen || binary.BigEndian.Uint32(buf[20:24]) != payloadMagic || int(binary.BigEndian.Uint32(buf[16:20])) != idx {
			g.stray.Add(1)
			continue
		}
		sentAt := int64(binary.BigEndian.Uint64(buf[8:16]))
		if sentAt < g.winStart.Load() || sentAt >= g.winEnd.Load() {
			continue
		}
		g.recv.Add(1)
		us := (now - sentAt) / 1000
		g.hist[min(max(us, 0), histBuckets-1)].Add(1)
	}
}

// send paces datagrams to target from every flow, pps each, spread evenly
// over the period, until stop closes. Late datagrams are sent at once
// (the schedule does not slip), so the offered rate is exact.
func (g *gen) send(target netip.AddrPort, pps int, stop <-chan struct{}) error {
	n := len(g.flows)
	interval := time.Second / time.Duration(n*pps)
	if interval <= 0 {
		return errors.New("rate too high for nanosecond pacing")
	}
	pkt := make([]byte, payloadLen)
	pkt[0] = 0x80
	binary.BigEndian.PutUint32(pkt[20:24], payloadMagic)
	binary.BigEndian.PutUint32(pkt[24:28], g.id)
	begin := time.Since(g.epoch)
	var k int64
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		now := time.Since(g.epoch)
		due := begin + time.Duration(k)*interval
		if due > now {
			time.Sleep(due - now)
			continue
		}
		for ; begin+time.Duration(k)*interval <= now; k++ {
			i := int(k % int64(n))
			at := time.Since(g.epoch).Nanoseconds()
			binary.BigEndian.PutUint64(pkt[8:16], uint64(at))
			binary.BigEndian.PutUint32(pkt[16:20], uint32(i))
			if _, err := g.flows[i].WriteToUDPAddrPort(pkt, target); err != nil {
				continue // ENOBUFS and the like: counted as lost
			}
			if at >= g.winStart.Load() && at < g.winEnd.Load() {
				g.sent.Add(1)
			}
		}
	}
}

// percentile returns the p-quantile of the recorded RTTs in microseconds.
func (g *gen) percentile(p float64) float64 {
	var total uint64
	for i := range g.hist {
		total += uint64(g.hist[i].Load())
	}
	if total == 0 {
		return 0
	}
	want := uint64(p * float64(total))
	var acc uint64
	for i := range g.hist {
		acc += uint64(g.hist[i].Load())
		if acc > want {
			return float64(i)
		}
	}
	return histBuckets
}

func (g *gen) close() {
	for _, c := range g.flows {
		c.Close()
	}
	g.wg.Wait()
}
