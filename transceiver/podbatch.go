package transceiver

import (
	"errors"
	"net"
	"net/netip"
	"sync"

	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Batched I/O on the pod socket, through udpio.BatchConn (recvmmsg and
// sendmmsg, nothing allocated per datagram): every reader (readLoop) takes
// up to podBatch datagrams per call, and the sessions' datagrams leave in
// batches through outQueue. Under load both cut the system calls per
// datagram; when datagrams trickle in, a batch is one datagram and the cost
// is that of a plain read or write.

// defaultReaders is how many goroutines read the pod socket when
// Config.Readers is zero: one per core the process may use, at most 4.
// Every reader runs the whole receive path of its datagrams (header, route,
// session queue), so one core is no longer the ceiling of a pod.
func defaultReaders() int { return min(udpio.Procs(), 4) }

// Why several readers on one socket rather than SO_REUSEPORT sockets: the
// kernel spreads a reuseport group by the 4-tuple hash, and a pod's peers
// are the few cluster relay replicas of its cluster, so one relay's whole
// traffic would still land on one socket. Readers of one socket share its
// queue evenly. Datagrams of one client may then be handed on out of order
// when two readers race; audio packets of one session are 20 ms apart, and
// SRTP, SCTP and DTLS all tolerate reordering.

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
	bc   *udpio.BatchConn // written only by the goroutine that set flushing

	mu       sync.Mutex
	pending  *outBatch // filled by send; guarded by mu
	spare    *outBatch // the flusher's, swapped with pending under mu
	flushing bool      // a goroutine is sending the queue; guarded by mu
	corked   int       // readers holding the queue (cork); guarded by mu
}

// outBatch is one batch of datagrams to send, in preallocated slots.
type outBatch struct {
	n    int
	bufs [podBatch]podBuf
	ms   [podBatch]udpio.Msg
}

func newOutQueue(conn *net.UDPConn, m *metrics) *outQueue {
	return &outQueue{conn: conn, m: m, bc: udpio.NewBatchConn(conn, podBatch), pending: &outBatch{}, spare: &outBatch{}}
}

// send queues a copy of pkt for to and, unless another goroutine is already
// sending or a reader has corked the queue, sends the queue. Send errors of
// a batch are counted (writeErrors), not returned; the error returned is
// that of a direct send when the queue was full and another goroutine was
// sending it.
func (q *outQueue) send(pkt []byte, to netip.AddrPort) error {
	q.mu.Lock()
	if q.pending.n == podBatch {
		if q.flushing {
			q.mu.Unlock()
			_, err := q.conn.WriteToUDPAddrPort(pkt, to)
			return err
		}
		q.drainLocked() // full while corked: send what there is
	}
	b := q.pending
	n := copy(b.bufs[b.n][:], pkt)
	b.ms[b.n] = udpio.Msg{Buf: b.bufs[b.n][:n], Addr: to}
	b.n++
	if !q.flushing && q.corked == 0 {
		q.drainLocked()
	}
	q.mu.Unlock()
	return nil
}

// cork holds the queue's datagrams until the matching uncork. A socket
// reader corks for the length of one receive batch: the echoes and
// answers its datagrams cause on the same goroutine (the pod's media path,
// media.go) then leave together in one sendmmsg when it uncorks, instead
// of one system call each. Nothing waits for more traffic: a batch is
// what one recvmmsg returned, handled without blocking.
func (q *outQueue) cork() {
	q.mu.Lock()
	q.corked++
	q.mu.Unlock()
}

// uncork releases a cork and, if it was the last, sends the queue.
func (q *outQueue) uncork() {
	q.mu.Lock()
	q.corked--
	if !q.flushing && q.corked == 0 {
		q.drainLocked()
	}
	q.mu.Unlock()
}

// drainLocked sends the queue until it is empty, releasing mu around each
// system call; datagrams queued meanwhile go in the next one. The caller
// holds mu and no other goroutine is flushing.
func (q *outQueue) drainLocked() {
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
}

// flush sends one batch; a datagram the kernel refuses is counted and
// skipped, so one unreachable relay does not hold back the rest.
func (q *outQueue) flush(b *outBatch) {
	for sent := 0; sent < b.n; {
		k, err := q.bc.WriteBatch(b.ms[sent:b.n])
		sent += k
		if err != nil {
			q.m.writeErrors.Inc()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			sent++
		}
	}
}
