// Package metric builds and registers the Prometheus collectors of
// rtcedge's components. It holds no state: the caller owns what it returns.
package metric

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter returns a counter with the given name and help text.
func Counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec returns a counter vector with the given name, help text and
// labels.
func CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Gauge returns a gauge with the given name and help text.
func Gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// Register registers cs with reg, stopping at the first failure, which it
// wraps with the component's name. A nil reg registers nothing.
func Register(reg prometheus.Registerer, component string, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register %s metrics: %w", component, err)
		}
	}
	return nil
}
