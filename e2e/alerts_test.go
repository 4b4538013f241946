package e2e

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/probe"
)

// TestAlertRulesNameRealMetrics keeps deploy/prometheus/alerts.yaml honest:
// every rtcedge_* metric its expressions use must be exported by the
// components (gathered from a running dev world and the probe's metrics).
func TestAlertRulesNameRealMetrics(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	exported := exportedMetrics{}
	exported.gather(t, w.Registry)
	// The probe's series are labelled by target: one real run creates them.
	preg := prometheus.NewRegistry()
	pm, err := probe.NewMetrics(preg)
	if err != nil {
		t.Fatal(err)
	}
	// A call's series (its loss ratio among them) appear once a call
	// completes: on a loaded machine the first may fail, so up to three.
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := probe.Continuous(ctx, probe.ContinuousConfig{
			Call:       probe.Config{SignalingURL: w.SignalingURL, Logger: testLogger()},
			Iterations: 1, Hold: 200 * time.Millisecond, Metrics: pm,
		})
		cancel()
		if err != nil {
			t.Fatalf("probe run: %v", err)
		}
		exported.gather(t, preg)
		if exported["rtcedge_probe_loss_ratio"] != nil || attempt == 3 {
			break
		}
		t.Logf("probe call %d exported no loss ratio (the call failed?); again", attempt)
	}

	data, err := os.ReadFile("../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	metricRE := regexp.MustCompile(`rtcedge_[a-z0-9_]+`)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			for _, m := range metricRE.FindAllString(r.Expr, -1) {
				if _, _, ok := exported.family(m); !ok {
					t.Errorf("alert %s uses %s, which no component exports", r.Alert, m)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no alert rules found")
	}
}
