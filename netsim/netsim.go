// Package netsim emulates wide-area links in user space, for machines whose
// kernels have no netem: a UDPLink forwards datagrams between a listening
// address and a target with configured one-way delay, jitter and loss per
// direction, and a partition switch; a TCPLink does the same (delay, jitter,
// partition) for TCP connections such as HTTP signaling, and
// NewTCPLinkWithHandshake also charges each connection's handshake round
// trip, for clients that open a connection per call (ICE-TCP).
//
// A multi-site simulation puts a UDPLink in front of each POP — it listens
// on the POP's public VIP and forwards to the relay's real address — and a
// TCPLink in front of signaling. The relay then sees the link's per-client
// upstream socket as the client address, as it would see a client behind a
// NAT.
//
// Like the relays, the links take their listening sockets as arguments and
// own them from then on; they open only their upstream sockets themselves.
package netsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// LinkConfig shapes one direction of a link.
type LinkConfig struct {
	// Delay is the one-way delay added to every packet.
	Delay time.Duration
	// Jitter spreads the delay uniformly over [Delay-Jitter, Delay+Jitter]
	// (never below zero). On a UDPLink packets may then arrive out of
	// order, as on a real path; a TCPLink keeps the byte stream in order.
	Jitter time.Duration
	// Loss is the probability (0..1) that a datagram is dropped. A TCPLink
	// ignores it: TCP would retransmit, which shows up as delay.
	Loss float64
	// Seed seeds the loss and jitter draws, so runs are reproducible. Links
	// with the same seed and config drop the same packet positions.
	Seed int64
	// Queue bounds the packets waiting in this direction; a datagram that
	// finds it full is dropped and counted (DropQueueFull). Zero means
	// DefaultQueue.
	Queue int
}

// DefaultQueue is the default bound of a direction's queue: at 50 packets per
// second per call it holds 160 calls' worth of one second of audio.
const DefaultQueue = 8192

// Validate reports a config that cannot be applied.
func (c LinkConfig) Validate() error {
	switch {
	case c.Delay < 0:
		return fmt.Errorf("netsim: negative delay %v", c.Delay)
	case c.Jitter < 0:
		return fmt.Errorf("netsim: negative jitter %v", c.Jitter)
	case c.Loss < 0 || c.Loss > 1 || math.IsNaN(c.Loss):
		return fmt.Errorf("netsim: loss %v outside 0..1", c.Loss)
	case c.Queue < 0:
		return fmt.Errorf("netsim: negative queue bound %d", c.Queue)
	}
	return nil
}

func (c LinkConfig) queue() int {
	if c.Queue == 0 {
		return DefaultQueue
	}
	return c.Queue
}

// DropReason says why a link dropped a datagram. Its String is suitable as a
// metric label.
type DropReason int

// Drop reasons.
const (
	DropLoss       DropReason = iota // the configured random loss
	DropPartition                    // the link was partitioned
	DropQueueFull                    // the direction's queue was full
	DropOversize                     // longer than MaxDatagram
	DropFlowLimit                    // too many client flows (UDP)
	DropWriteError                   // the socket refused the write
	NumDropReasons
)

var dropNames = [NumDropReasons]string{"loss", "partition", "queue_full", "oversize", "flow_limit", "write_error"}

func (r DropReason) String() string {
	if r >= 0 && r < NumDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// DirectionStats counts one direction of a link.
type DirectionStats struct {
	Forwarded uint64 // datagrams (UDP) or chunks (TCP) delivered
	Bytes     uint64 // payload bytes delivered
	Dropped   [NumDropReasons]uint64
	Queued    int // waiting now
}

// DroppedTotal sums the drops over every reason.
func (s DirectionStats) DroppedTotal() uint64 {
	var n uint64
	for _, d := range s.Dropped {
		n += d
	}
	return n
}

// drawer makes the loss and jitter draws of one direction. Not safe for
// concurrent use: its owner serialises calls.
type drawer struct {
	rng *rand.Rand
}

// newDrawer seeds a generator per direction: the salt keeps the two
// directions of a link from dropping the same positions.
func newDrawer(seed int64, salt uint64) drawer {
	return drawer{rng: rand.New(rand.NewPCG(uint64(seed), salt))}
}

// lose reports whether a packet is lost at probability p.
func (d drawer) lose(p float64) bool { return p > 0 && d.rng.Float64() < p }

// delay draws a one-way delay for cfg.
func (d drawer) delay(cfg *LinkConfig) time.Duration {
	if cfg.Jitter <= 0 {
		return cfg.Delay
	}
	off := cfg.Delay + time.Duration(d.rng.Int64N(int64(2*cfg.Jitter)+1)) - cfg.Jitter
	return max(off, 0)
}

// MaxDatagram is the largest datagram a UDPLink forwards; longer ones are
// dropped (DropOversize). WebRTC keeps its datagrams under the path MTU, so
// this leaves room to spare while keeping pooled buffers small.
const MaxDatagram = 2048

// bufPool holds MaxDatagram-sized buffers; pointers avoid an allocation per
// Put.
var bufPool = sync.Pool{New: func() any { b := make([]byte, MaxDatagram); return &b }}

func getBuf() *[]byte  { return bufPool.Get().(*[]byte) }
func putBuf(b *[]byte) { bufPool.Put(b) }
