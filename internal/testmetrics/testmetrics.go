// Package testmetrics snapshots Prometheus registries in tests, to show
// that an event changed exactly the series it should (a forged datagram:
// its drop counter, nothing else). Only tests import it.
package testmetrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Snapshot is every series of a registry: "name,label=value,..." → value.
type Snapshot map[string]float64

// Take gathers reg.
func Take(t testing.TB, reg prometheus.Gatherer) Snapshot {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := Snapshot{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var b strings.Builder
			b.WriteString(mf.GetName())
			for _, l := range m.GetLabel() {
				b.WriteString("," + l.GetName() + "=" + l.GetValue())
			}
			out[b.String()] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// OnlyIncremented fails t unless the one difference from before to after
// is +1 on the series key (e.g. "rtcedge_x_dropped_packets_total,reason=mac").
func OnlyIncremented(t testing.TB, before, after Snapshot, key string) {
	t.Helper()
	if _, ok := after[key]; !ok {
		t.Errorf("no series %s", key)
	}
	for k, v := range after {
		want := before[k]
		if k == key {
			want++
		}
		if v != want {
			t.Errorf("%s went %v → %v (want %v)", k, before[k], v, want)
		}
	}
}
