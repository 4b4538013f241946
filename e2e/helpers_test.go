package e2e

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testlog"
)

func testLogger() *slog.Logger { return testlog.Logger() }

func startWorld(t *testing.T, cfg devworld.Config) *devworld.World {
	t.Helper()
	cfg.Logger = testLogger()
	w, err := devworld.Start(cfg)
	if err != nil {
		t.Fatalf("start dev world: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("close dev world: %v", err)
		}
		if err := w.Err(); err != nil {
			t.Errorf("dev world component failed: %v", err)
		}
	})
	return w
}

// metricSum adds up every sample of a metric family whose labels include
// all of want (for a histogram, its observation count).
// histogramTotals returns the sample count and sum of a histogram over
// its label sets that have the labels in want.
func histogramTotals(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == k && l.GetValue() == v)
				}
				if !found {
					continue metrics
				}
			}
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

func metricSum(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			switch {
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// eventually polls cond every 20ms until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s", d, what)
		case <-tick.C:
		}
	}
}
