package transceiver

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
)

// Batched I/O on the pod socket: every reader takes up to ioBatch datagrams
// per recvmmsg, and one writer sends what the sessions queued with sendmmsg.
// Under load both cut the system calls per datagram; when datagrams trickle
// in, a batch is one datagram and the cost is that of a plain read or write.
// Neither allocates per datagram (TestBatchIONoAllocs). On systems without
// recvmmsg/sendmmsg (podbatch_other.go) a batch is always one datagram.

// ioBatch is the most datagrams one read or write system call moves.
const ioBatch = 32

// defaultReaders is how many goroutines read the pod socket when
// Config.Readers is zero: one per core the process may use, at most 4. Every
// reader runs the whole receive path of its datagrams (header, route,
// session queue), so one core is no longer the ceiling of a pod.
func defaultReaders() int { return min(runtime.GOMAXPROCS(0), 4) }

// Why several readers on one socket rather than SO_REUSEPORT sockets: the
// kernel spreads a reuseport group by the 4-tuple hash, and a pod's peers
// are the few cluster relay replicas of its cluster, so one relay's whole
// traffic would still land on one socket. Readers of one socket share its
// queue evenly. Datagrams of one client may then be handed on out of order
// when two readers race; audio packets of one session are 20 ms apart, and
// SRTP, SCTP and DTLS all tolerate reordering.

// readBatches reads the socket until it is closed and hands every datagram
// to handle. It never blocks on Pion: a full session queue drops the
// datagram. Several readBatches may run at once on one socket.
func (s *podSocket) readBatches() error {
	r, err := newBatchReader(s.conn)
	if err != nil {
		return err
	}
	defer r.release()
	for {
		n, err := r.read()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		for i := range n {
			buf, size, from, trunc := r.message(i)
			if trunc {
				// Filled the buffer: maybe truncated, never a WebRTC datagram.
				s.m.drop(dropOversize)
				continue
			}
			if s.handle(buf, size, unmap(from)) {
				r.replace(i) // handed on: the slot gets a fresh buffer
			}
		}
	}
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// outQueue is the pod socket's send side, shared by every session. A
// session's goroutine queues its datagram (send); if no other goroutine is
// sending at that moment, it sends the queue itself, with one sendmmsg, and
// goes on until the queue is empty. Datagrams queued meanwhile by other
// sessions go out in that same call or the next. Nobody waits for a writer
// goroutine to be scheduled, so a lone datagram costs one system call as
// before, and under load the datagrams of goroutines on other cores share
// system calls. A full queue makes the sender write its own datagram.
type outQueue struct {
	// Static after newOutQueue.
	conn *net.UDPConn
	m    *metrics
	w    *batchWriter // used by the goroutine that set flushing

	mu       sync.Mutex
	pending  *outBatch // filled by send; guarded by mu
	spare    *outBatch // the flusher's, swapped with pending under mu
	flushing bool      // a goroutine is sending the queue; guarded by mu
}

// outBatch is one batch of datagrams to send, in preallocated slots.
type outBatch struct {
	n    int
	bufs [ioBatch]podBuf
	lens [ioBatch]int
	to   [ioBatch]netip.AddrPort
}

func newOutQueue(conn *net.UDPConn, m *metrics) *outQueue {
	return &outQueue{conn: conn, m: m, w: newBatchWriter(conn), pending: &outBatch{}, spare: &outBatch{}}
}

// send queues a copy of pkt for to and, unless another goroutine is already
// sending, sends the queue. Send errors of a batch are counted
// (writeErrors), not returned; the error returned is that of a direct send
// when the queue was full.
func (q *outQueue) send(pkt []byte, to netip.AddrPort) error {
	q.mu.Lock()
	if q.pending.n == ioBatch {
		q.mu.Unlock()
		_, err := q.conn.WriteToUDPAddrPort(pkt, to)
		return err
	}
	b := q.pending
	b.lens[b.n] = copy(b.bufs[b.n][:], pkt)
	b.to[b.n] = to
	b.n++
	if q.flushing {
		q.mu.Unlock()
		return nil
	}
	q.flushing = true
	for q.pending.n > 0 {
		b := q.pending
		q.pending, q.spare = q.spare, b
		q.mu.Unlock()
		q.flush(b)
		b.n = 0
		q.mu.Lock()
	}
	q.flushing = false
	q.mu.Unlock()
	return nil
}

// flush sends one batch; a datagram the kernel refuses is counted and
// skipped, so one unreachable relay does not hold back the rest.
func (q *outQueue) flush(b *outBatch) {
	for sent := 0; sent < b.n; {
		k, err := q.w.write(b, sent)
		if err != nil {
			q.m.writeErrors.Inc()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			sent++
			continue
		}
		sent += k
	}
}
