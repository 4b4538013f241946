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

func TestConfigExpandsEnv(t *testing.T) {
	t.Setenv("RTCEDGE_TEST_POD_IP", "10.1.2.3")
	path := filepath.Join(t.TempDir(), "t.yaml")
	if err := os.WriteFile(path, []byte("cluster: 1\ndata_advertise: \"${RTCEDGE_TEST_POD_IP}:7000\"\napi_advertise: \"$NOT_EXPANDED\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg TransceiverConfig
	if err := loadConfig(path, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.DataAdvertise != "10.1.2.3:7000" || cfg.APIAdvertise != "$NOT_EXPANDED" {
		t.Errorf("data_advertise %q, api_advertise %q", cfg.DataAdvertise, cfg.APIAdvertise)
	}
}

func TestWildcardAdvertiseRefused(t *testing.T) {
	if _, _, err := listenData("0.0.0.0:0", ""); err == nil {
		t.Error("a data socket on 0.0.0.0 without data_advertise was accepted")
	}
	c, ap, err := listenData("0.0.0.0:0", "127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if ap.String() != "127.0.0.1:7000" {
		t.Errorf("advertised %v", ap)
	}
}
