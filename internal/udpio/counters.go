package udpio

import "github.com/prometheus/client_golang/prometheus"

// Drops holds one counter per typed drop reason R, indexed by R, so the hot
// path counts a drop with one slice index: no label lookup, no string
// building. Every reason's series exists (at zero) from start-up.
type Drops[R ~uint8] struct {
	c []prometheus.Counter
}

// NewDrops resolves a counter on vec for every label; labels[i] is the label
// of reason R(i), and prefix is put in front of each (a codec's reasons
// appear as e.g. "encap_short" in a tier's drop counter).
func NewDrops[R ~uint8](vec *prometheus.CounterVec, prefix string, labels ...string) *Drops[R] {
	d := &Drops[R]{c: make([]prometheus.Counter, len(labels))}
	for i, l := range labels {
		d.c[i] = vec.WithLabelValues(prefix + l)
	}
	return d
}

// Inc counts one drop for r. A reason without a label counts under reason
// 0, which every package reserves for its catch-all.
func (d *Drops[R]) Inc(r R) {
	if int(r) < len(d.c) {
		d.c[r].Inc()
		return
	}
	d.c[0].Inc()
}
