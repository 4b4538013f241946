package globalrelay

// Tests of the workers' placement settings in the node's config (CPUs,
// steering, bundling).

import (
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
)

// TestNodeConfigPlacement: a node with two workers pinned to CPUs and the
// CPU steering program comes up; an unknown steering or a negative CPU is
// a config error naming the field.
func TestNodeConfigPlacement(t *testing.T) {
	key := strings.Repeat("A", 43) + "="
	base := func() Config {
		return Config{POP: 1, PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1", Workers: 2,
			Token: node.TokenKeys{Keys: []string{"1:" + key}}, HopKeys: nodetest.HopKeys(t, 1), Gossip: nodetest.Gossip("gr", "")}
	}
	cfg := base()
	cfg.CPUs, cfg.Steering, cfg.Bundle = []int{0, 0}, "cpu", true
	n, err := newNode(t, cfg, nil)
	if err != nil {
		t.Fatalf("pinned workers with cpu steering: %v", err)
	}
	n.Close()
	for _, tc := range []struct {
		name, want string
		edit       func(*Config)
	}{
		{"unknown steering", "steering", func(c *Config) { c.Steering = "sideways" }},
		{"negative cpu", "cpus", func(c *Config) { c.CPUs = []int{-1} }},
	} {
		cfg := base()
		tc.edit(&cfg)
		cfg.Defaults()
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want an error about %s", tc.name, err, tc.want)
		}
	}
}
