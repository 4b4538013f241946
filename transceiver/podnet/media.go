package podnet

import (
	"encoding/binary"
	"fmt"
	"iter"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/srtp/v3"
)

// The session's media path (docs/benchmarks.md, "The pod's own media path").
//
// Pion runs every received SRTP datagram through five goroutines: the ICE
// candidate's reader, the DTLS/SRTP demux, the SRTP session's reader, the
// read stream's buffer and the track reader, then back out through the
// interceptors. At 50 datagrams a second per call each hand-off wakes a
// sleeping goroutine, and those wake-ups were most of the pod's CPU. Once
// DTLS is up a voice session does not need any of it: the keys are known,
// there is one audio stream each way, and the reports a browser wants from
// us are two small RTCP packets a second.
//
// So once the PeerConnection is connected, the pod socket's reader that
// receives a session's SRTP or SRTCP decrypts it there and then (Media
// .receive) and hands the audio to the session on the same goroutine; the
// backend's audio is encrypted and queued for the socket on the goroutine
// that writes it (Media.SendRTP). Pion keeps everything else: ICE
// (checks, consent, nomination), DTLS, SCTP and the data channel, and the
// session lifecycle. The keys come from the DTLS connection as Pion's own
// SRTP session derives them (RFC 5764 §4.2), into contexts of our own; Pion
// never encrypts RTP or RTCP of the session, so no SRTP index is ever used
// twice under one key.
//
// Reports (RFC 3550 §6.4): every session sends a sender report (or a
// receiver report before its first audio) about once a second with one
// report block on the client's stream, so the browser keeps its quality
// figures (remote-inbound-rtp, remote-outbound-rtp); the client's sender
// reports feed the LSR/DLSR fields and its receiver reports our round-trip
// time metric. One goroutine of the pod sends every session's reports
// (Socket.Report), instead of two report loops per session.

// replayWindow is the SRTP and SRTCP replay window of the client's streams
// (packets): a replayed or duplicated datagram is dropped (dropSRTP).
const replayWindow = 64

// mediaBuf is the largest media datagram the pod builds or takes.
const mediaBuf = 1500

// Media is one session's SRTP media once DTLS is up (see above).
type Media struct {
	// Static after NewMedia.
	sess  Session
	sock  *Socket
	ufrag string // the session's server ufrag: its conns on the POPs

	// Inbound, guarded by inMu: the client's SRTP and SRTCP.
	inMu     sync.Mutex
	rx       *srtp.Context
	rxHdr    rtp.Header
	lastTS   uint32
	recv     recvStats
	lastSR   uint32 // middle 32 bits of the NTP time of the client's last sender report
	lastSRAt int64  // unix nanoseconds when it arrived; 0 before one
	stopped  bool   // the session is ending: nothing more reaches the backend
	// rxKeys remake rx for retryROC; rtpOK: an RTP packet of the client's
	// has authenticated; rocRetries counts retryROC's attempts.
	rxKeys     rxKeys
	rtpOK      bool
	rocRetries int
	saved      []byte   // the datagram as it came, while retryROC may need it
	ssrcs      []uint32 // the client's SSRCs that authenticated, at most maxClientSSRCs

	// Outbound, guarded by txMu: our audio and reports.
	txMu  sync.Mutex
	tx    *srtp.Context
	ssrc  uint32 // our stream's, as the answer announced it
	pt    uint8  // the negotiated Opus payload type
	txHdr rtp.Header
	txBuf []byte // our next datagram, encrypted in place
	sent  sendStats

	next int64 // unix nanoseconds of the next report; owned by the report loop
}

// recvStats are the RFC 3550 (appendix A.3, A.8) receiver statistics of the
// client's audio stream.
type recvStats struct {
	ssrc            uint32
	started         bool
	base, max       uint16
	cycles          uint32
	received        uint32
	expectedPrior   uint32
	receivedPrior   uint32
	transit         uint32
	jitter          float64 // in RTP timestamp units
	haveTransitPrev bool
}

// sendStats describe our audio stream for sender reports.
type sendStats struct {
	packets, octets uint32
	lastTS          uint32
	lastAt          int64 // unix nanoseconds when lastTS was sent; 0 before any
}

// clockRate is the RTP clock of Opus (RFC 7587).
const clockRate = 48000

// NewMedia builds a session's media path from the SRTP keys its DTLS
// connection derived (RFC 5764 section 4.2) and its audio stream's SSRC
// and payload type; Start puts it on the packet path.
func (s *Socket) NewMedia(sess Session, ufrag string, keys srtp.SessionKeys, profile srtp.ProtectionProfile, ssrc uint32, pt uint8) (*Media, error) {
	rx, err := newRxContext(keys.RemoteMasterKey, keys.RemoteMasterSalt, profile)
	if err != nil {
		return nil, err
	}
	tx, err := srtp.CreateContext(keys.LocalMasterKey, keys.LocalMasterSalt, profile)
	if err != nil {
		return nil, err
	}
	return &Media{
		sess: sess, sock: s, ufrag: ufrag, rx: rx, tx: tx, rxKeys: rxKeys{keys.RemoteMasterKey, keys.RemoteMasterSalt, profile},
		ssrc: ssrc, pt: pt, txBuf: make([]byte, mediaBuf),
		next: s.now().UnixNano() + int64(reportInterval/2) + rand.Int64N(int64(reportInterval/2)),
	}, nil
}

// Start moves the session's SRTP onto the media path: the client's, at
// its conns on pops and its ICE-TCP conns, and reports from Report.
func (mp *Media) Start(pops iter.Seq[uint16]) {
	s := mp.sock
	for id := range pops {
		if pc := s.lookup(id); pc != nil {
			pc.mux.setMedia(mp.ufrag, mp)
		}
	}
	s.tcp.setMedia(mp.ufrag, mp)
	s.mediaMu.Lock()
	s.media[mp] = struct{}{}
	s.mediaMu.Unlock()
}

// rxKeys are what the client's SRTP and SRTCP are opened with.
type rxKeys struct {
	key, salt []byte
	profile   srtp.ProtectionProfile
}

// maxROCRetries bounds retryROC's attempts per session; maxClientSSRCs
// the client's SSRCs a session keeps receive state for.
const (
	maxROCRetries  = 8
	maxClientSSRCs = 4
)

// srtpOverhead is the most SRTP and SRTCP add to a packet: the longest
// authentication tag (16) and the SRTCP index (4).
const srtpOverhead = 20

// rtpHeaderLen is the length of the RTP header at the start of b (fixed
// part, CSRCs, header extension), as the wire has it; b was parsed once.
func rtpHeaderLen(b []byte) int {
	n := 12 + 4*int(b[0]&0x0f)
	if b[0]&0x10 != 0 && len(b) >= n+4 {
		n += 4 + 4*int(binary.BigEndian.Uint16(b[n+2:]))
	}
	return min(n, len(b))
}

// newRxContext is the SRTP context that opens a client's SRTP and SRTCP,
// with replay protection.
func newRxContext(key, salt []byte, profile srtp.ProtectionProfile) (*srtp.Context, error) {
	return srtp.CreateContext(key, salt, profile, srtp.SRTPReplayProtection(replayWindow), srtp.SRTCPReplayProtection(replayWindow))
}

// isRTCP tells SRTCP from SRTP among datagrams of ClassRTP (RFC 5761 §4:
// RTCP packet types 192–223 in the second byte).
func isRTCP(b []byte) bool { return len(b) >= 2 && b[1] >= 192 && b[1] <= 223 }

// receive takes one SRTP or SRTCP datagram from the client (decrypted in
// place, so b is clobbered). Audio goes to the session before it returns.
// Called by the pod socket's readers.
func (mp *Media) receive(b []byte) {
	now := mp.sock.now()
	mp.inMu.Lock()
	defer mp.inMu.Unlock()
	if mp.stopped {
		return
	}
	rtcpPkt := isRTCP(b)
	ssrc, ok := packetSSRC(b, rtcpPkt)
	if !ok {
		mp.sock.m.drop(dropSRTP)
		return
	}
	known := mp.knownSSRC(ssrc)
	if !known && len(mp.ssrcs) == maxClientSSRCs {
		mp.sock.m.drop(dropSSRC)
		return
	}
	if rtcpPkt {
		plain, err := mp.rx.DecryptRTCP(b[:0], b, nil)
		if err != nil {
			mp.sock.m.drop(dropSRTP)
			return
		}
		if !known {
			mp.ssrcs = append(mp.ssrcs, ssrc)
		}
		mp.readRTCP(plain, now)
		return
	}
	retry := !mp.rtpOK && mp.rocRetries < maxROCRetries
	if retry {
		mp.saved = append(mp.saved[:0], b...) // a failed open may clobber b
	}
	plain, err := mp.rx.DecryptRTP(b[:0], b, &mp.rxHdr)
	if err != nil && retry {
		plain, err = mp.retryROC(b, ssrc)
	}
	if err != nil {
		mp.sock.m.drop(dropSRTP)
		return
	}
	if !mp.rtpOK {
		mp.rtpOK, mp.saved = true, nil
	}
	if !known {
		mp.ssrcs = append(mp.ssrcs, ssrc)
	}
	payload := plain[rtpHeaderLen(plain):]
	if mp.rxHdr.Padding && len(payload) > 0 {
		pad := int(payload[len(payload)-1])
		if pad > len(payload) {
			mp.sock.m.drop(dropSRTP)
			return
		}
		payload = payload[:len(payload)-pad]
	}
	mp.recv.update(&mp.rxHdr, now.UnixNano())
	d := FrameDuration(mp.lastTS, mp.rxHdr.Timestamp)
	mp.lastTS = mp.rxHdr.Timestamp
	mp.sess.Audio(payload, d)
}

// packetSSRC reads the sender's SSRC of an SRTP or SRTCP datagram.
func packetSSRC(b []byte, rtcpPkt bool) (uint32, bool) {
	if rtcpPkt {
		if len(b) < 8 {
			return 0, false
		}
		return binary.BigEndian.Uint32(b[4:8]), true
	}
	if len(b) < 12 {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[8:12]), true
}

// knownSSRC reports whether a packet of ssrc has authenticated before.
// Every SSRC that authenticates costs receive state in the SRTP context for
// the rest of the call, and a client holds the keys: only the first
// maxClientSSRCs get that far (a browser uses one or two).
func (mp *Media) knownSSRC(ssrc uint32) bool {
	for _, x := range mp.ssrcs {
		if x == ssrc {
			return true
		}
	}
	return false
}

// retryROC opens b (restored from mp.saved) again, for a session none of
// whose RTP has authenticated yet, as if the client's sequence number had
// wrapped once already. Pion's own SRTP session opens a client's first
// packets until the media path takes over, and when the client's random
// start was just below the wrap the client is on rollover counter 1 there,
// while a new context guesses 0 and would fail every packet of the call.
// On success the retried context replaces rx (the SRTCP replay window
// starts afresh with it: at most a few packets can have come before).
func (mp *Media) retryROC(b []byte, ssrc uint32) ([]byte, error) {
	mp.rocRetries++
	rx, err := newRxContext(mp.rxKeys.key, mp.rxKeys.salt, mp.rxKeys.profile)
	if err != nil {
		return nil, err
	}
	rx.SetROC(ssrc, 1)
	copy(b, mp.saved)
	plain, err := rx.DecryptRTP(b[:0], b, &mp.rxHdr)
	if err != nil {
		return nil, err
	}
	mp.rx = rx
	return plain, nil
}

// Stop ends the media path's deliveries to the session and its reports:
// once it returns, no reader is in the session's Audio and none will call
// it again, so the session can close its backend.
func (mp *Media) Stop() {
	mp.inMu.Lock()
	mp.stopped = true
	mp.inMu.Unlock()
	mp.sock.mediaMu.Lock()
	delete(mp.sock.media, mp)
	mp.sock.mediaMu.Unlock()
}

// update counts one packet (RFC 3550 A.1, A.8). A packet of another SSRC
// than the first restarts the statistics (the client's stream changed).
func (r *recvStats) update(h *rtp.Header, now int64) {
	if !r.started || h.SSRC != r.ssrc {
		*r = recvStats{ssrc: h.SSRC, started: true, base: h.SequenceNumber, max: h.SequenceNumber}
	} else if d := h.SequenceNumber - r.max; d != 0 && d < 1<<15 {
		if h.SequenceNumber < r.max {
			r.cycles += 1 << 16
		}
		r.max = h.SequenceNumber
	}
	r.received++
	arrival := now / int64(time.Second/time.Duration(clockRate)) // in RTP units
	transit := uint32(arrival) - h.Timestamp                     // modulo 2^32, as both clocks wrap
	if r.haveTransitPrev {
		d := int64(int32(transit - r.transit))
		if d < 0 {
			d = -d
		}
		r.jitter += (float64(d) - r.jitter) / 16
	}
	r.transit, r.haveTransitPrev = transit, true
}

// block appends one report block (RFC 3550 §6.4.1) on the client's stream
// and moves the interval counters on.
func (r *recvStats) block(b []byte, lastSR uint32, lastSRAt, now int64) []byte {
	extMax := r.cycles + uint32(r.max)
	expected := extMax - uint32(r.base) + 1
	lost := int64(expected) - int64(r.received)
	lost = max(min(lost, 0x7fffff), -0x800000)
	expInt, recvInt := expected-r.expectedPrior, r.received-r.receivedPrior
	r.expectedPrior, r.receivedPrior = expected, r.received
	var fraction uint8
	if lostInt := int64(expInt) - int64(recvInt); expInt != 0 && lostInt > 0 {
		fraction = uint8(lostInt << 8 / int64(expInt))
	}
	var dlsr uint32
	if lastSRAt != 0 {
		dlsr = uint32((now - lastSRAt) * 65536 / int64(time.Second))
	}
	b = binary.BigEndian.AppendUint32(b, r.ssrc)
	b = binary.BigEndian.AppendUint32(b, uint32(fraction)<<24|uint32(lost)&0xffffff)
	b = binary.BigEndian.AppendUint32(b, extMax)
	b = binary.BigEndian.AppendUint32(b, uint32(r.jitter))
	b = binary.BigEndian.AppendUint32(b, lastSR)
	return binary.BigEndian.AppendUint32(b, dlsr)
}

// RTCP packet types (RFC 3550 §12.1).
const (
	rtcpSR   = 200
	rtcpRR   = 201
	rtcpSDES = 202
)

// readRTCP takes the client's compound RTCP: the NTP time of its sender
// reports (for our LSR/DLSR) and the round trip its reports on our stream
// give. Everything else (feedback an audio call does not act on) is
// ignored.
func (mp *Media) readRTCP(b []byte, now time.Time) {
	for len(b) >= 8 {
		words := int(binary.BigEndian.Uint16(b[2:]))
		size := 4 * (words + 1)
		if b[0]>>6 != 2 || size > len(b) {
			return
		}
		pkt, count := b[:size], int(b[0]&0x1f)
		b = b[size:]
		blocks := []byte(nil)
		switch pkt[1] {
		case rtcpSR:
			if len(pkt) < 28 {
				return
			}
			mp.lastSR = binary.BigEndian.Uint32(pkt[10:])
			mp.lastSRAt = now.UnixNano()
			blocks = pkt[28:]
		case rtcpRR:
			blocks = pkt[8:]
		}
		for i := 0; i < count && len(blocks) >= 24; i++ {
			blk := blocks[:24]
			blocks = blocks[24:]
			if binary.BigEndian.Uint32(blk) != mp.ssrc {
				continue
			}
			mp.sock.m.quality.observeBlock(true, blk)
			lsr, dlsr := binary.BigEndian.Uint32(blk[16:]), binary.BigEndian.Uint32(blk[20:])
			if lsr == 0 {
				continue
			}
			// RFC 3550 §6.4.1: A − LSR − DLSR, in 1/65536 s.
			if rtt := ntpMiddle(now) - lsr - dlsr; rtt < 1<<31 {
				mp.sock.m.clientRTT.Observe(float64(rtt) / 65536)
			}
		}
	}
}

// ntpTime is t as a 64-bit NTP timestamp.
func ntpTime(t time.Time) uint64 {
	const unixToNTP = 2208988800
	secs := uint64(t.Unix()) + unixToNTP
	frac := uint64(t.Nanosecond()) << 32 / uint64(time.Second)
	return secs<<32 | frac
}

// ntpMiddle is the middle 32 bits of t's NTP timestamp (LSR's unit).
func ntpMiddle(t time.Time) uint32 { return uint32(ntpTime(t) >> 16) }

// SendRTP encrypts one frame of our audio and sends it on the selected
// path; hdr carries the sequence number, timestamp and marker, the media
// path sets SSRC and payload type.
func (mp *Media) SendRTP(hdr *rtp.Header, payload []byte) error {
	mp.txMu.Lock()
	defer mp.txMu.Unlock()
	mp.txHdr = *hdr
	mp.txHdr.SSRC, mp.txHdr.PayloadType = mp.ssrc, mp.pt
	n, err := mp.txHdr.MarshalTo(mp.txBuf)
	if err != nil {
		return err
	}
	if n+len(payload)+srtpOverhead > len(mp.txBuf) {
		return fmt.Errorf("podnet: audio frame of %d bytes too large", len(payload))
	}
	n += copy(mp.txBuf[n:], payload)
	out, err := mp.tx.EncryptRTP(mp.txBuf[:0], mp.txBuf[:n], &mp.txHdr)
	if err != nil {
		return err
	}
	mp.sent.packets++
	mp.sent.octets += uint32(len(payload))
	mp.sent.lastTS, mp.sent.lastAt = hdr.Timestamp, mp.sock.now().UnixNano()
	return mp.write(out)
}

// reportInterval is the mean interval between a session's reports; each
// is sent 0.5–1.5 intervals after the last (RFC 3550 §6.2: randomised so
// that the pod's sessions do not report in step).
const reportInterval = time.Second

// cname is the SDES CNAME of every session's stream.
const cname = "rtcedge"

// sendReport sends the session's compound RTCP if it is due: a sender report
// (a receiver report before our first audio) with a block on the client's
// stream once one has arrived, and the SDES CNAME RFC 3550 requires.
func (mp *Media) sendReport(now time.Time) {
	if now.UnixNano() < mp.next {
		return
	}
	mp.next = now.UnixNano() + int64(reportInterval/2) + rand.Int64N(int64(reportInterval))

	// Never inMu under txMu: a reader holds inMu while the backend it
	// calls sends the echo (SendRTP).
	var blk [24]byte
	mp.inMu.Lock()
	var block []byte
	if mp.recv.started {
		block = mp.recv.block(blk[:0], mp.lastSR, mp.lastSRAt, now.UnixNano())
	}
	mp.inMu.Unlock()
	if block != nil {
		mp.sock.m.quality.observeBlock(false, block)
	}

	mp.txMu.Lock()
	defer mp.txMu.Unlock()
	b := mp.appendReport(mp.txBuf[:0], now, block)
	out, err := mp.tx.EncryptRTCP(mp.txBuf[:0], b, nil)
	if err != nil {
		return
	}
	if mp.write(out) == nil {
		mp.sock.m.reportsSent.Inc()
	}
}

// appendReport appends our compound RTCP to b: a sender report once we
// have sent audio (else a receiver report), with block (zero or one report
// block on the client's stream), then the SDES CNAME. The caller holds
// txMu.
func (mp *Media) appendReport(b []byte, now time.Time, block []byte) []byte {
	rc := byte(len(block) / 24)
	if mp.sent.lastAt != 0 {
		// The RTP time that corresponds to now on our stream's clock.
		rtpTS := mp.sent.lastTS + uint32((now.UnixNano()-mp.sent.lastAt)*int64(clockRate)/int64(time.Second))
		b = append(b, 0x80|rc, rtcpSR)
		b = binary.BigEndian.AppendUint16(b, uint16(6+6*int(rc)))
		b = binary.BigEndian.AppendUint32(b, mp.ssrc)
		b = binary.BigEndian.AppendUint64(b, ntpTime(now))
		b = binary.BigEndian.AppendUint32(b, rtpTS)
		b = binary.BigEndian.AppendUint32(b, mp.sent.packets)
		b = binary.BigEndian.AppendUint32(b, mp.sent.octets)
	} else {
		b = append(b, 0x80|rc, rtcpRR)
		b = binary.BigEndian.AppendUint16(b, uint16(1+6*int(rc)))
		b = binary.BigEndian.AppendUint32(b, mp.ssrc)
	}
	b = append(b, block...)
	// SDES: one chunk, CNAME, the end item, padded to a 32-bit boundary.
	chunk := 4 + 2 + len(cname) + 1
	chunk += (4 - chunk%4) % 4
	b = append(b, 0x81, rtcpSDES)
	b = binary.BigEndian.AppendUint16(b, uint16(chunk/4))
	b = binary.BigEndian.AppendUint32(b, mp.ssrc)
	b = append(b, 1, byte(len(cname)))
	b = append(b, cname...)
	for range chunk - (4 + 2 + len(cname)) {
		b = append(b, 0)
	}
	return b
}

// write sends an SRTP or SRTCP datagram to the client on the session's
// selected candidate pair, as Pion's ICE would: through that POP's UDP
// conn, or its TCP conn for an ICE-TCP client.
func (mp *Media) write(b []byte) error {
	pop, peer, tcp := mp.sess.Path()
	if pop == 0 {
		return errNoSelectedPath
	}
	if tcp {
		c := mp.sock.tcp.conn(mp.ufrag, pop)
		if c == nil {
			return errNoRoute
		}
		_, err := c.WriteToAddrPort(b, peer)
		return err
	}
	pc := mp.sock.lookup(pop)
	if pc == nil {
		return errNoRoute
	}
	_, err := pc.write(b, peer, mp.ufrag)
	return err
}

// Report sends every started media path's reports when due, until done
// closes.
func (s *Socket) Report(done <-chan struct{}) {
	tick := time.NewTicker(reportInterval / 8)
	defer tick.Stop()
	var batch []*Media
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		batch = batch[:0]
		s.mediaMu.Lock()
		for mp := range s.media {
			batch = append(batch, mp)
		}
		s.mediaMu.Unlock()
		now := s.now()
		for _, mp := range batch {
			mp.sendReport(now)
		}
		clear(batch)
	}
}

// FrameDuration derives an Opus frame's duration from the RTP clock (48 kHz),
// falling back to 20 ms on the first packet or after a jump.
func FrameDuration(prev, cur uint32) time.Duration {
	d := time.Duration(cur-prev) * time.Second / clockRate
	if prev == 0 || d < 2500*time.Microsecond || d > 120*time.Millisecond {
		return 20 * time.Millisecond
	}
	return d
}
