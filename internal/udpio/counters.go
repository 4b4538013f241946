package udpio

import "github.com/prometheus/client_golang/prometheus"

// DropCounters pre-resolves one counter per drop reason, so the hot path
// increments a counter without a label lookup, and every reason's series
// exists (at zero) from start-up.
type DropCounters struct {
	byReason map[string]prometheus.Counter
	other    prometheus.Counter
}

// NewDropCounters resolves a counter for every reason in reasons (plus
// "other") on vec.
func NewDropCounters(vec *prometheus.CounterVec, reasons ...string) *DropCounters {
	return NewPrefixedDropCounters(vec, "", reasons...)
}

// NewPrefixedDropCounters is NewDropCounters for reasons that come from
// another package (such as a codec's decode errors): Inc takes the bare
// reason and counts it under the label value prefix+reason, without building
// that string on the hot path.
func NewPrefixedDropCounters(vec *prometheus.CounterVec, prefix string, reasons ...string) *DropCounters {
	d := &DropCounters{byReason: make(map[string]prometheus.Counter, len(reasons)+1)}
	for _, r := range reasons {
		d.byReason[r] = vec.WithLabelValues(prefix + r)
	}
	d.other = vec.WithLabelValues(prefix + "other")
	d.byReason["other"] = d.other
	return d
}

// Inc counts one drop. An unknown reason counts as "other".
func (d *DropCounters) Inc(reason string) {
	if c, ok := d.byReason[reason]; ok {
		c.Inc()
		return
	}
	d.other.Inc()
}
