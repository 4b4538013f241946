package e2e

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// exportedMetrics is what the components export: every metric family's
// label names, each true when some series gives it a non-empty value.
type exportedMetrics map[string]map[string]bool

// gather adds g's families.
func (e exportedMetrics) gather(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		labels := e[mf.GetName()]
		if labels == nil {
			labels = map[string]bool{}
			e[mf.GetName()] = labels
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = labels[l.GetName()] || l.GetValue() != ""
			}
		}
	}
}

// family resolves a name a query uses to the exported family: the name
// itself, or a histogram's _bucket, _sum or _count series (bucket says
// which, for the le label).
func (e exportedMetrics) family(name string) (fam string, bucket, ok bool) {
	if _, ok := e[name]; ok {
		return name, false, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, cut := strings.CutSuffix(name, suffix); cut {
			if _, ok := e[b]; ok {
				return b, suffix == "_bucket", true
			}
		}
	}
	return "", false, false
}
