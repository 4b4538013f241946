package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestExampleConfigsParse keeps deploy/examples in step with the config
// structs: decoding is strict, so a renamed or removed key fails here.
func TestExampleConfigsParse(t *testing.T) {
	for _, tc := range []struct {
		file string
		cfg  any
	}{
		{"transceiver.yaml", &TransceiverConfig{}},
		{"clusterrelay.yaml", &ClusterRelayConfig{}},
		{"globalrelay.yaml", &GlobalRelayConfig{}},
		{"signaling.yaml", &SignalingConfig{}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			if err := loadConfig(filepath.Join("..", "..", "deploy", "examples", tc.file), tc.cfg); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestConfigRejectsUnknownKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("cluster: 1\nclustr_typo: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := loadConfig(path, &TransceiverConfig{}); err == nil {
		t.Fatal("unknown key accepted")
	}
}
