package podnet

import (
	"bytes"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/srtp/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

func TestRecvStatsReportBlock(t *testing.T) {
	var r recvStats
	now := time.Unix(1_700_000_000, 0).UnixNano()
	// 65534, 65535, 0, 2: one lost (1), one sequence wrap.
	for i, seq := range []uint16{65534, 65535, 0, 2} {
		r.update(&rtp.Header{SSRC: 9, SequenceNumber: seq, Timestamp: uint32(960 * i)}, now+int64(20*time.Millisecond)*int64(i))
	}
	lastSRAt := now - int64(250*time.Millisecond)
	rr := parseBlock(t, r.block(nil, 0x11223344, lastSRAt, now))
	want := rtcp.ReceptionReport{SSRC: 9, FractionLost: 1 * 256 / 5, TotalLost: 1, LastSequenceNumber: 1<<16 + 2, LastSenderReport: 0x11223344, Delay: 65536 / 4}
	if rr != want {
		t.Errorf("first block %+v, want %+v", rr, want)
	}
	// The next interval loses nothing: fraction 0, the total stays.
	for i, seq := range []uint16{3, 4, 5} {
		r.update(&rtp.Header{SSRC: 9, SequenceNumber: seq, Timestamp: uint32(960 * (i + 4))}, now+int64(20*time.Millisecond)*int64(i+4))
	}
	rr = parseBlock(t, r.block(nil, 0, 0, now))
	if rr.FractionLost != 0 || rr.TotalLost != 1 || rr.LastSequenceNumber != 1<<16+5 || rr.Delay != 0 {
		t.Errorf("second block %+v: want fraction 0, total 1, highest 65541, no DLSR", rr)
	}
	// A new SSRC starts over.
	r.update(&rtp.Header{SSRC: 10, SequenceNumber: 100}, now)
	if rr := parseBlock(t, r.block(nil, 0, 0, now)); rr.SSRC != 10 || rr.TotalLost != 0 || rr.LastSequenceNumber != 100 {
		t.Errorf("after an SSRC change %+v", rr)
	}
}

func parseBlock(t *testing.T, b []byte) rtcp.ReceptionReport {
	t.Helper()
	var rr rtcp.ReceiverReport
	pkt := append([]byte{0x81, rtcpRR, 0, 7, 0, 0, 0, 1}, b...)
	if err := rr.Unmarshal(pkt); err != nil {
		t.Fatalf("report block does not parse: %v", err)
	}
	return rr.Reports[0]
}

func TestReportFormat(t *testing.T) {
	now := time.Unix(1_700_000_000, 500_000_000)
	var r recvStats
	r.update(&rtp.Header{SSRC: 9, SequenceNumber: 7}, now.UnixNano())
	block := r.block(nil, 0, 0, now.UnixNano())

	// Before our first audio: a receiver report and the CNAME.
	mp := &Media{ssrc: 42}
	pkts, err := rtcp.Unmarshal(mp.appendReport(nil, now, block))
	if err != nil {
		t.Fatalf("receiver report does not parse: %v", err)
	}
	if rr, ok := pkts[0].(*rtcp.ReceiverReport); !ok || rr.SSRC != 42 || len(rr.Reports) != 1 || rr.Reports[0].SSRC != 9 {
		t.Errorf("first packet %#v, want a receiver report from 42 on 9", pkts[0])
	}
	checkCNAME(t, pkts)

	// After: a sender report whose RTP time is now on our stream's clock.
	mp.sent = sendStats{packets: 10, octets: 800, lastTS: 1000, lastAt: now.Add(-20 * time.Millisecond).UnixNano()}
	pkts, err = rtcp.Unmarshal(mp.appendReport(nil, now, nil))
	if err != nil {
		t.Fatalf("sender report does not parse: %v", err)
	}
	sr, ok := pkts[0].(*rtcp.SenderReport)
	if !ok {
		t.Fatalf("first packet %#v, want a sender report", pkts[0])
	}
	if sr.SSRC != 42 || sr.PacketCount != 10 || sr.OctetCount != 800 || sr.RTPTime != 1000+960 || len(sr.Reports) != 0 || sr.NTPTime != ntpTime(now) {
		t.Errorf("sender report %+v", sr)
	}
	if secs := sr.NTPTime>>32 - 2208988800; secs != uint64(now.Unix()) {
		t.Errorf("NTP seconds %d, want %d", secs, now.Unix())
	}
	checkCNAME(t, pkts)
}

func checkCNAME(t *testing.T, pkts []rtcp.Packet) {
	t.Helper()
	sdes, ok := pkts[len(pkts)-1].(*rtcp.SourceDescription)
	if !ok || len(sdes.Chunks) != 1 || sdes.Chunks[0].Source != 42 || sdes.Chunks[0].Items[0].Type != rtcp.SDESCNAME || sdes.Chunks[0].Items[0].Text != cname {
		t.Errorf("last packet %#v, want the SDES CNAME of 42", pkts[len(pkts)-1])
	}
}

// audioRecorder is a Handler that keeps the audio it is given.
type audioRecorder struct {
	mu     sync.Mutex
	frames [][]byte
	durs   []time.Duration
}

func (a *audioRecorder) Audio(p []byte, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.frames = append(a.frames, bytes.Clone(p))
	a.durs = append(a.durs, d)
}
func (a *audioRecorder) Event([]byte) {}
func (a *audioRecorder) Close() error { return nil }

// TestMediaPathReceive drives a media path with SRTP and SRTCP sealed as a
// client would: audio reaches the backend; forged, replayed and garbage
// datagrams are dropped and counted; the client's sender report feeds LSR
// and its receiver report on our stream the round-trip metric.
func TestMediaPathReceive(t *testing.T) {
	mp, client, rec, m := testMediaPath(t)
	now := mp.sock.now()

	seal := func(seq uint16, payload string, ext bool) []byte {
		h := rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: uint32(seq) * 960, SSRC: 9}
		if ext {
			if err := h.SetExtension(1, []byte{0x30}); err != nil {
				t.Fatal(err)
			}
		}
		return sealHeader(t, client, h, payload)
	}
	srtpDrops := func() float64 { return testutil.ToFloat64(m.dropVec.WithLabelValues(dropSRTP.String())) }

	first := seal(1, "hello", true)
	mp.receive(bytes.Clone(first))
	mp.receive(seal(2, "world", false))
	mp.receive(first) // a replay
	forged := seal(3, "forged", false)
	forged[len(forged)-1] ^= 1
	mp.receive(forged)
	mp.receive([]byte{0x80, 0x6f, 0, 1}) // too short for SRTP
	rec.mu.Lock()
	got := rec.frames
	rec.mu.Unlock()
	if len(got) != 2 || string(got[0]) != "hello" || string(got[1]) != "world" {
		t.Fatalf("backend got %q, want the two authentic frames, extension stripped", got)
	}
	if d := srtpDrops(); d != 3 {
		t.Errorf("srtp drops %v, want 3 (replay, forgery, garbage)", d)
	}

	// The client's sender report: its NTP time becomes our LSR.
	sr := &rtcp.SenderReport{SSRC: 9, NTPTime: 0xAABBCCDD_EEFF0011}
	srtcp := func(p rtcp.Packet) []byte {
		plain, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		out, err := client.EncryptRTCP(nil, plain, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	mp.receive(srtcp(sr))
	if mp.lastSR != 0xCCDDEEFF || mp.lastSRAt != now.UnixNano() {
		t.Errorf("LSR %#x at %d, want 0xccddeeff at now", mp.lastSR, mp.lastSRAt)
	}
	// The client's receiver report on our stream: our sender report left
	// 50 ms ago and the client held it 10 ms (DLSR), so the round trip is
	// A − LSR − DLSR = 40 ms.
	ourSR := now.Add(-50 * time.Millisecond)
	rr := &rtcp.ReceiverReport{SSRC: 9, Reports: []rtcp.ReceptionReport{{SSRC: 42, LastSenderReport: ntpMiddle(ourSR), Delay: 65536 * 10 / 1000}}}
	mp.receive(srtcp(rr))
	var h dto.Metric
	if err := m.clientRTT.Write(&h); err != nil {
		t.Fatal(err)
	}
	if n, sum := h.GetHistogram().GetSampleCount(), h.GetHistogram().GetSampleSum(); n != 1 || sum < 0.039 || sum > 0.041 {
		t.Errorf("client RTT: %d samples, sum %.4f s; want one of 40 ms", n, sum)
	}
	if d := srtpDrops(); d != 3 {
		t.Errorf("srtp drops %v after RTCP, want still 3", d)
	}
}

// srtpPair returns the pod's receiving context (newRxContext) and a
// client's sending context under one test key.
func srtpPair(t *testing.T) (rx, client *srtp.Context) {
	t.Helper()
	key, salt := bytes.Repeat([]byte{7}, 16), bytes.Repeat([]byte{8}, 12)
	const profile = srtp.ProtectionProfileAeadAes128Gcm
	rx, err := newRxContext(key, salt, profile)
	if err != nil {
		t.Fatal(err)
	}
	if client, err = srtp.CreateContext(key, salt, profile); err != nil {
		t.Fatal(err)
	}
	return rx, client
}

func TestRTPHeaderLen(t *testing.T) {
	h := rtp.Header{Version: 2, CSRC: []uint32{1, 2}}
	if err := h.SetExtension(3, []byte{1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	b, err := (&rtp.Packet{Header: h, Payload: []byte("xy")}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if n := rtpHeaderLen(b); n != len(b)-2 {
		t.Errorf("header length %d, want %d", n, len(b)-2)
	}
	// A header extension block with trailing padding words is skipped whole.
	padded := append([]byte{0x90, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0xbe, 0xde, 0, 2, 0x10, 0xaa, 0, 0, 0, 0, 0, 0}, "p"...)
	if n := rtpHeaderLen(padded); n != len(padded)-1 || binary.BigEndian.Uint16(padded[14:]) != 2 {
		t.Errorf("padded header length %d, want %d", n, len(padded)-1)
	}
}

// testMediaPath is a media path on srtpPair's keys with a recording
// backend, as newMediaPath would make it.
func testMediaPath(t *testing.T) (*Media, *srtp.Context, *audioRecorder, *Metrics) {
	t.Helper()
	key, salt := bytes.Repeat([]byte{7}, 16), bytes.Repeat([]byte{8}, 12)
	rx, client := srtpPair(t)
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	rec := &audioRecorder{}
	sock := &Socket{m: m, now: func() time.Time { return now }}
	return &Media{sess: &fakeSession{audio: rec}, sock: sock, rx: rx, rxKeys: rxKeys{key, salt, srtp.ProtectionProfileAeadAes128Gcm}, ssrc: 42}, client, rec, m
}

// sealRTP is a client's SRTP packet of one 20 ms Opus frame.
func sealRTP(t *testing.T, c *srtp.Context, ssrc uint32, seq uint16, payload string) []byte {
	return sealHeader(t, c, rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: uint32(seq) * 960, SSRC: ssrc}, payload)
}

func sealHeader(t *testing.T, c *srtp.Context, h rtp.Header, payload string) []byte {
	t.Helper()
	plain, err := (&rtp.Packet{Header: h, Payload: []byte(payload)}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.EncryptRTP(nil, plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (a *audioRecorder) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.frames)
}

// TestMediaPathAfterWrapInPion: Pion's own SRTP session opens a client's
// first packets until the media path takes over. When the client's
// sequence number wrapped in those (it starts at random), the client is on
// rollover counter 1 while a new context assumes 0, and without a retry
// every packet of the call would fail to authenticate.
func TestMediaPathAfterWrapInPion(t *testing.T) {
	mp, client, rec, m := testMediaPath(t)
	for seq := uint16(65533); seq != 0; seq++ {
		_ = sealRTP(t, client, 9, seq, "pion's") // opened by Pion before the switch
	}
	for seq := range uint16(200) {
		mp.receive(sealRTP(t, client, 9, seq, "ours"))
	}
	if n := rec.count(); n != 200 {
		t.Errorf("backend got %d of 200 frames after a wrap Pion saw", n)
	}
	if d := testutil.ToFloat64(m.dropVec.WithLabelValues(dropSRTP.String())); d != 0 {
		t.Errorf("%v srtp drops, want 0", d)
	}

	// Forgeries before a session's first authentic packet get a bounded
	// number of retries, and a later authentic packet still opens.
	mp2, client2, rec2, _ := testMediaPath(t)
	for i := range 3 * maxROCRetries {
		p := sealRTP(t, client2, 9, uint16(i), "forged")
		p[len(p)-1] ^= 1
		mp2.receive(p)
	}
	if mp2.rocRetries != maxROCRetries {
		t.Errorf("%d retries for %d forgeries, want the bound %d", mp2.rocRetries, 3*maxROCRetries, maxROCRetries)
	}
	mp2.receive(sealRTP(t, client2, 9, 500, "real"))
	if rec2.count() != 1 {
		t.Error("an authentic packet after forgeries did not open")
	}
}

// TestMediaPathSSRCLimit: every SSRC that authenticates costs receive
// state in the SRTP context for the rest of the call, so a client (who
// holds the keys) could grow it without bound by changing SSRC. Past
// maxClientSSRCs new SSRCs are dropped before decryption; known ones go on.
func TestMediaPathSSRCLimit(t *testing.T) {
	mp, client, rec, m := testMediaPath(t)
	for i := range maxClientSSRCs + 5 {
		mp.receive(sealRTP(t, client, uint32(100+i), 1, "x"))
	}
	if n := rec.count(); n != maxClientSSRCs {
		t.Errorf("backend got %d frames of %d SSRCs, want %d (the limit)", n, maxClientSSRCs+5, maxClientSSRCs)
	}
	if d := testutil.ToFloat64(m.dropVec.WithLabelValues(dropSSRC.String())); d != 5 {
		t.Errorf("%v ssrc drops, want 5", d)
	}
	mp.receive(sealRTP(t, client, 100, 2, "y")) // a known SSRC
	if n := rec.count(); n != maxClientSSRCs+1 {
		t.Error("a known SSRC was dropped after the limit")
	}
	// Forgeries do not use up the limit: only authenticated SSRCs count.
	mp2, client2, rec2, _ := testMediaPath(t)
	for i := range 2 * maxClientSSRCs {
		p := sealRTP(t, client2, uint32(200+i), 1, "forged")
		p[len(p)-1] ^= 1
		mp2.receive(p)
	}
	mp2.receive(sealRTP(t, client2, 7, 1, "real"))
	if rec2.count() != 1 {
		t.Error("forged SSRCs used up the limit")
	}
}

// TestRecvStatsJitterTimestampWrap: the client's RTP timestamp starts at
// random and wraps at 2^32 (on 2 % of 30 min calls); transit times must be
// compared modulo 2^32 (RFC 3550 A.8), or the jitter we report jumps to
// thousands of seconds.
func TestRecvStatsJitterTimestampWrap(t *testing.T) {
	var r recvStats
	now := time.Unix(1_700_000_000, 0).UnixNano()
	ts := uint32(1<<32 - 960*5)
	for i := range 10 {
		r.update(&rtp.Header{SSRC: 9, SequenceNumber: uint16(i), Timestamp: ts}, now+int64(i)*int64(20*time.Millisecond))
		ts += 960
	}
	if r.jitter > 1 {
		t.Errorf("jitter %.0f RTP units (%.0f s) across a timestamp wrap with perfect pacing, want 0", r.jitter, r.jitter/48000)
	}
}

func TestFrameDuration(t *testing.T) {
	for _, tc := range []struct {
		prev, cur uint32
		want      time.Duration
	}{
		{0, 960, 20 * time.Millisecond},                 // first packet: default
		{960, 1920, 20 * time.Millisecond},              // 20 ms at 48 kHz
		{960, 1440, 10 * time.Millisecond},              // 10 ms frame
		{960, 3840, 60 * time.Millisecond},              // 60 ms frame
		{960, 960, 20 * time.Millisecond},               // duplicate timestamp
		{960, 960 + 480000, 20 * time.Millisecond},      // jump: default
		{0xFFFFFC40, 0x00000000, 20 * time.Millisecond}, // wrap-around
	} {
		if got := FrameDuration(tc.prev, tc.cur); got != tc.want {
			t.Errorf("FrameDuration(%d, %d) = %v, want %v", tc.prev, tc.cur, got, tc.want)
		}
	}
}
