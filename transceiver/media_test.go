package transceiver

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

func TestMediaPathSupported(t *testing.T) {
	// Fails when a Pion upgrade renames or retypes the DTLS transport's
	// connection field: the pod would fall back to Pion's media path and
	// cost twice the CPU per session (TestPodCPUPerSession also fails then).
	if !mediaPathSupported() {
		t.Fatalf("webrtc.DTLSTransport has no field %q of type *dtls.Conn: the pod's media path cannot get the SRTP keys", dtlsConnField)
	}
}

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
	mp := &mediaPath{ssrc: 42}
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
	rx, client := srtpPair(t)
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	rec := &audioRecorder{}
	s := &session{t: &Transceiver{cfg: Config{Now: clock}, m: m}, handler: rec}
	mp := &mediaPath{s: s, rx: rx, ssrc: 42}

	seal := func(seq uint16, payload string, ext bool) []byte {
		h := rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: uint32(seq) * 960, SSRC: 9}
		if ext {
			if err := h.SetExtension(1, []byte{0x30}); err != nil {
				t.Fatal(err)
			}
		}
		plain, err := (&rtp.Packet{Header: h, Payload: []byte(payload)}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		out, err := client.EncryptRTP(nil, plain, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
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
	if s.lastActivity.Load() != now.UnixNano() {
		t.Error("audio did not count as activity")
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
