package podnet

import (
	"encoding/binary"

	"github.com/prometheus/client_golang/prometheus"
)

// Directions of the media quality histograms, their "direction" label.
const (
	// DirToClient: the pod's audio as the client received it, from the
	// report blocks of the client's RTCP on the pod's stream.
	DirToClient = "to_client"
	// DirFromClient: the client's audio as the pod received it, from the
	// report blocks the pod's media path sends on the client's stream.
	DirFromClient = "from_client"
)

// quality are the media quality histograms of the pod's media path: the
// loss and jitter of every RFC 3550 report block on a call's audio, in
// either direction (the round trip is clientRTT). The observers are
// resolved at start-up, so a report costs no label lookup.
type quality struct {
	loss, jitter         *prometheus.HistogramVec
	lossTo, lossFrom     prometheus.Observer
	jitterTo, jitterFrom prometheus.Observer
}

func newQuality() quality {
	q := quality{
		loss: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_transceiver_media_loss_ratio",
			Help: "Fraction of a call's audio packets lost in one RTCP report interval (about a second), by direction: " +
				"to_client from the clients' receiver reports on the pod's audio, from_client from the pod's reports on theirs.",
			Buckets: []float64{0, .005, .01, .02, .03, .05, .1, .2, .5, 1},
		}, []string{"direction"}),
		jitter: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rtcedge_transceiver_media_jitter_seconds",
			Help:    "Interarrival jitter (RFC 3550) of a call's audio at each RTCP report, by direction (to_client, from_client as for media_loss_ratio).",
			Buckets: []float64{.001, .002, .005, .01, .02, .03, .05, .1, .2, .5},
		}, []string{"direction"}),
	}
	q.lossTo, q.lossFrom = q.loss.WithLabelValues(DirToClient), q.loss.WithLabelValues(DirFromClient)
	q.jitterTo, q.jitterFrom = q.jitter.WithLabelValues(DirToClient), q.jitter.WithLabelValues(DirFromClient)
	return q
}

func (q *quality) collectors() []prometheus.Collector {
	return []prometheus.Collector{q.loss, q.jitter}
}

// observeBlock records one 24-byte report block (RFC 3550 §6.4.1): its
// fraction lost and its jitter, in units of the Opus RTP clock.
func (q *quality) observeBlock(toClient bool, blk []byte) {
	if len(blk) < 24 {
		return
	}
	loss := float64(blk[4]) / 256
	jitter := float64(binary.BigEndian.Uint32(blk[12:])) / clockRate
	if toClient {
		q.lossTo.Observe(loss)
		q.jitterTo.Observe(jitter)
		return
	}
	q.lossFrom.Observe(loss)
	q.jitterFrom.Observe(jitter)
}
