package podnet

import (
	"testing"
	"time"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// histogram returns the sample count and sum of one histogram child.
func histogram(t *testing.T, o prometheus.Observer) (uint64, float64) {
	t.Helper()
	var h dto.Metric
	if err := o.(prometheus.Metric).Write(&h); err != nil {
		t.Fatal(err)
	}
	return h.GetHistogram().GetSampleCount(), h.GetHistogram().GetSampleSum()
}

// TestMediaQualityFromReports: the loss and jitter of the client's receiver
// report on the pod's stream feed the to_client histograms (with or
// without an LSR), a block on another SSRC does not, and the pod's own
// report on the client's stream feeds from_client.
func TestMediaQualityFromReports(t *testing.T) {
	mp, client, _, m := testMediaPath(t)
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
	// A quarter lost, 480 units of jitter (10 ms at 48 kHz); no LSR yet.
	mp.receive(srtcp(&rtcp.ReceiverReport{SSRC: 9, Reports: []rtcp.ReceptionReport{
		{SSRC: 42, FractionLost: 64, Jitter: 480},
		{SSRC: 77, FractionLost: 255, Jitter: 48000}, // not our stream
	}}))
	if n, sum := histogram(t, m.quality.lossTo); n != 1 || sum != 0.25 {
		t.Errorf("to_client loss: %d samples, sum %v; want one of 0.25", n, sum)
	}
	if n, sum := histogram(t, m.quality.jitterTo); n != 1 || sum < 0.0099 || sum > 0.0101 {
		t.Errorf("to_client jitter: %d samples, sum %v s; want one of 10 ms", n, sum)
	}

	// The pod's report on the client's stream: 4 expected, 3 received.
	now := mp.sock.now()
	for i, seq := range []uint16{1, 2, 4} {
		mp.recv.update(&rtp.Header{SSRC: 9, SequenceNumber: seq, Timestamp: uint32(seq) * 960}, now.Add(time.Duration(i)*20*time.Millisecond).UnixNano())
	}
	_, tx := srtpPair(t)
	mp.tx = tx
	mp.sendReport(now) // no selected path: not sent, but measured
	if n, sum := histogram(t, m.quality.lossFrom); n != 1 || sum != 64.0/256 {
		t.Errorf("from_client loss: %d samples, sum %v; want one of 0.25 (1 of 4, in 1/256)", n, sum)
	}
	if n, _ := histogram(t, m.quality.jitterFrom); n != 1 {
		t.Errorf("from_client jitter: %d samples, want 1", n)
	}
}
