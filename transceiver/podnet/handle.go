package podnet

import (
	"errors"
	"net"
	"net/netip"
	"sync"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// The pod's packet path: every reader (readLoop) takes up to podBatch
// datagrams per system call, handle takes each from parse to the hand-off
// (or drop), and every datagram toward a client leaves through send, in
// batches (outQueue). recvmmsg and sendmmsg through udpio.BatchConn:
// nothing is allocated per datagram, and when datagrams trickle in a batch
// is one datagram and costs a plain read or write.

// podBuf is one datagram buffer of the pod socket: the largest datagram
// between tiers (encap.MaxDatagram, the one size limit of every tier) plus
// one byte, so that a longer datagram is seen as such and dropped.
type podBuf = [encap.MaxDatagram + 1]byte

var bufPool = sync.Pool{New: func() any { return new(podBuf) }}

// podBatch is the most datagrams the pod socket reads or writes per
// system call.
const podBatch = 32

// readLoop reads conn (the pod socket or a sibling of it) until it is
// closed, a batch per system call. It never blocks on Pion: a full session
// queue drops the datagram.
func (s *Socket) readLoop(conn *net.UDPConn) error {
	bc := udpio.NewBatchConn(conn, podBatch)
	bufs := make([]*podBuf, podBatch)
	ms := make([]udpio.Msg, podBatch)
	for i := range bufs {
		bufs[i] = bufPool.Get().(*podBuf)
		ms[i].Buf = bufs[i][:]
	}
	defer func() {
		for _, b := range bufs {
			bufPool.Put(b)
		}
	}()
	err := bc.ReadLoop(ms, func(n int) bool {
		s.out.cork()
		defer s.out.uncork()
		for i := range n {
			if ms[i].N > encap.MaxDatagram {
				// Longer than any tier forwards: never a WebRTC datagram.
				s.m.drop(dropOversize)
				continue
			}
			if encap.IsBundle(bufs[i][:ms[i].N]) {
				s.unbundle(bufs[i][:ms[i].N], ms[i].Addr)
				continue
			}
			// Sources are unmapped by BatchConn.
			if s.handle(bufs[i], ms[i].N, ms[i].Addr) {
				bufs[i] = bufPool.Get().(*podBuf) // handed on: take a fresh one
				ms[i].Buf = bufs[i][:]
			}
		}
		return true
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// unbundle hands every item of a bundle (docs/bundle.md) to handle as if
// it had come alone from the bundle's sender, each in a pooled buffer of
// its own. A malformed bundle is dropped whole.
func (s *Socket) unbundle(b []byte, from netip.AddrPort) {
	if _, err := encap.CheckBundle(b); err != nil {
		s.m.encapDrops.Inc(encap.ReasonOf(err))
		return
	}
	for off := encap.BundleHeaderLen; off < len(b); {
		var item []byte
		item, off = encap.NextItem(b, off)
		buf := bufPool.Get().(*podBuf)
		n := copy(buf[:], item)
		if !s.handle(buf, n, from) {
			bufPool.Put(buf)
		}
	}
}

// handle takes one datagram from a cluster relay from parse to its end:
// Pion's queue for its session (true: buf was handed on and must not be
// reused by the caller), the session's media path, the pod's own probe, or
// a counted drop. Several socket readers call it at once.
func (s *Socket) handle(buf *podBuf, n int, from netip.AddrPort) bool {
	// Parse: the header, verified before any field of it is believed.
	pkt := buf[:n]
	if !s.relays.Trusted(from) {
		s.m.drop(dropUnknownRelay)
		return false
	}
	h, hl, err := encap.Decode(pkt)
	if err == nil && h.Cluster == s.cluster {
		err = s.keys.Load().Verify(pkt, hl)
	}
	switch {
	case err != nil:
		s.m.encapDrops.Inc(encap.ReasonOf(err))
		return false
	case h.ToClient:
		s.m.drop(dropDirection)
		return false
	case h.Cluster != s.cluster || h.Pod != s.pod:
		s.m.drop(dropWrongPod)
		return false
	case n-hl == 0:
		s.m.drop(dropEmpty)
		return false
	case n-hl > encap.MaxPayload:
		s.m.drop(dropOversize)
		return false
	}
	if h.TCP {
		return s.tcp.handle(buf, n, hl, h, from)
	}

	// Decide: the client's return route first (from the verified header),
	// then whose datagram it is.
	pc := s.lookup(h.POP)
	if pc == nil {
		s.m.drop(dropUnknownPOP)
		return false
	}
	call, isCall := s.rtp.lookup(h.Client)
	if isCall && h.Token != call.nonce {
		// Another flow's token at a phone call's address: neither the
		// call's media nor a route for it (rtp.go).
		s.m.drop(dropRTPToken)
		return false
	}
	if !pc.learn(h, from, n-hl, s.now().UnixNano()) {
		s.m.drop(dropRouteTable)
		return false
	}
	payload := pkt[hl:]
	if isCall {
		s.handleRTP(pc, call, h.Client, payload)
		return false
	}
	if pc.answer(h.Client, payload) {
		return false // the answer to our own probe: not Pion's
	}
	class := stunmsg.DemuxClass(payload)
	if class == stunmsg.ClassRTP {
		if c := pc.mux.routed(h.Client); c != nil {
			if mp := c.media.Load(); mp != nil {
				// A connected session's SRTP: decrypted and handed to
				// the session here, on this reader.
				s.m.in(n - hl)
				mp.receive(payload)
				c.arrived(h.Client)
				return false
			}
		}
	}

	// Hand on to Pion: the payload moves to the front so the buffer can be
	// handed over as is (datagrams are small, a copy is cheaper than a
	// second buffer); a check of an ICE-restarted session is translated to
	// the credentials its agent knows.
	copy(buf[:], payload)
	n = s.restarts.rewriteIn(buf[:], n-hl, s.now())
	c, reason, ok := pc.mux.deliver(buf, n, h.Client)
	if !ok {
		if reason == dropUnknownClient && class == stunmsg.ClassRTP {
			s.stray(pc, h.Token, h.Client) // maybe its caller behind a rebound NAT
		}
		s.m.drop(reason)
		return false
	}
	s.m.in(n)
	c.arrived(h.Client)
	return true
}

// send seals b behind hdr and sends it to relay from the pod socket: the
// pod's only write.
func (s *Socket) send(hdr *encap.Header, relay netip.AddrPort, b []byte) (int, error) {
	buf := bufPool.Get().(*podBuf)
	defer bufPool.Put(buf)
	hl, err := hdr.Put(buf[:])
	if err != nil || len(b) > encap.MaxPayload {
		s.m.drop(dropOversize)
		return 0, errTooLarge
	}
	copy(buf[hl:], b)
	s.keys.Load().Seal(buf[:hl+len(b)], hl)
	if err := s.out.send(buf[:hl+len(b)], relay); err != nil { // batched; it copies
		s.m.writeErrors.Inc()
		return 0, err
	}
	s.m.packetsOut.Inc()
	s.m.bytesOut.Add(float64(len(b)))
	return len(b), nil
}

// outQueue is the pod socket's send side, shared by every session. A
// session's goroutine queues its datagram (send); if no other goroutine is
// sending at that moment, it sends the queue itself, with one sendmmsg, and
// goes on until the queue is empty. Datagrams queued meanwhile by other
// sessions go out in that same call or the next. Nobody waits for a writer
// goroutine to be scheduled, so a lone datagram costs one system call, as
// a direct write would, and under load the datagrams of goroutines on other cores share
// system calls. A full queue makes the sender write its own datagram.
type outQueue struct {
	// Static after newOutQueue.
	conn *net.UDPConn
	m    *Metrics
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

func newOutQueue(conn *net.UDPConn, m *Metrics) *outQueue {
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
// answers its datagrams cause on the same goroutine (the media path) then
// leave together in one sendmmsg when it uncorks, instead of one system
// call each. Nothing waits for more traffic: a batch is what one recvmmsg
// returned, handled without blocking.
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
