package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/signaling"
	"github.com/rtcedge/rtcedge/sipfront"
	"github.com/rtcedge/rtcedge/transceiver"
)

// validated is a role config: defaults, then validation.
type validated interface {
	Defaults()
	Validate() error
}

// TestExampleConfigsParse keeps deploy/examples in step with the config
// structs: decoding is strict, so a renamed or removed key fails here, and
// each file must validate with its secrets in the environment.
func TestExampleConfigsParse(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	t.Setenv("RTCEDGE_TOKEN_KEYS", "1:"+base64.StdEncoding.EncodeToString(key))
	t.Setenv("RTCEDGE_GOSSIP_KEY", base64.StdEncoding.EncodeToString(key))
	t.Setenv("RTCEDGE_HOP_KEYS", "1/1:"+base64.StdEncoding.EncodeToString(key[:16]))
	for _, v := range []string{"RTCEDGE_GLOBAL_GOSSIP_KEY", "RTCEDGE_CLUSTER_GOSSIP_KEY"} {
		t.Setenv(v, base64.StdEncoding.EncodeToString(key))
	}
	for _, v := range []string{"RTCEDGE_APP_API_KEY", "RTCEDGE_SESSION_API_SECRET", "RTCEDGE_SESSION_API_SECRET_1"} {
		t.Setenv(v, "example-secret-0123456789")
	}
	t.Setenv("RTCEDGE_SESSION_API_SECRET_SHA256", strings.Repeat("ab", 32))
	t.Setenv("RTCEDGE_SIGNALING_AUTHORITY_KEYS", "signaling/1:"+base64.StdEncoding.EncodeToString(key))
	t.Setenv("POD_IP", "10.0.0.9")
	t.Setenv("CARRIER_A_SIP_PASSWORD", "example-secret")
	for _, tc := range []struct {
		file string
		cfg  validated
	}{
		{"transceiver.yaml", &transceiver.Config{}},
		{"clusterrelay.yaml", &clusterrelay.Config{}},
		{"globalrelay.yaml", &globalrelay.Config{}},
		{"signaling.yaml", &signaling.Config{}},
		{"sipfront.yaml", &sipfront.NodeConfig{}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			if err := config.Load(filepath.Join("..", "..", "deploy", "examples", tc.file), tc.cfg); err != nil {
				t.Fatal(err)
			}
			tc.cfg.Defaults()
			if err := tc.cfg.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestExampleTransceiverRealtimeBackend: the transceiver example's
// commented Realtime backend lines, uncommented in place of backend_addr,
// parse strictly and validate.
func TestExampleTransceiverRealtimeBackend(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	t.Setenv("RTCEDGE_TOKEN_KEYS", "1:"+base64.StdEncoding.EncodeToString(key))
	t.Setenv("RTCEDGE_HOP_KEYS", "1/1:"+base64.StdEncoding.EncodeToString(key[:16]))
	t.Setenv("RTCEDGE_CLUSTER_GOSSIP_KEY", base64.StdEncoding.EncodeToString(key))
	t.Setenv("RTCEDGE_SESSION_API_SECRET_SHA256", strings.Repeat("ab", 32))
	t.Setenv("POD_IP", "10.0.0.9")
	t.Setenv("CARRIER_A_SIP_PASSWORD", "example-secret")
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", "transceiver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	found := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "backend_addr:") {
			continue
		}
		if u, ok := strings.CutPrefix(l, "# backend_"); ok {
			l, found = "backend_"+u, found+1
		}
		lines = append(lines, l)
	}
	if found != 3 {
		t.Fatalf("found %d commented backend_ lines, want backend_url, backend_protocol and backend_rate", found)
	}
	path := filepath.Join(t.TempDir(), "transceiver.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg transceiver.Config
	if err := config.Load(path, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cfg.BackendURL, "wss://") || cfg.BackendProtocol != "ga" || cfg.BackendRate != 24000 {
		t.Errorf("backend settings %q %q %d", cfg.BackendURL, cfg.BackendProtocol, cfg.BackendRate)
	}
}

// TestExampleConfigNeedsPodIP: the examples advertise ${POD_IP}; without it
// the load fails naming the variable instead of advertising ":7000".
func TestExampleConfigNeedsPodIP(t *testing.T) {
	t.Setenv("POD_IP", "") // restored after the test
	os.Unsetenv("POD_IP")
	var cfg transceiver.Config
	err := config.Load(filepath.Join("..", "..", "deploy", "examples", "transceiver.yaml"), &cfg)
	if !errors.Is(err, config.ErrUnsetVariable) || !strings.Contains(err.Error(), "POD_IP") {
		t.Fatalf("err = %v, want one naming POD_IP", err)
	}
}

// TestRoleConfigsRejectBadValues: each role's Validate rejects negative
// rates, bursts and timeouts and bad addresses.
func TestRoleConfigsRejectBadValues(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	t.Setenv("RTCEDGE_TOKEN_KEYS", "1:"+base64.StdEncoding.EncodeToString(key))
	t.Setenv("RTCEDGE_HOP_KEYS", "1/1:"+base64.StdEncoding.EncodeToString(key[:16]))
	gossip := "  bind: 127.0.0.1:0\n  insecure: true\n"
	base := map[string]string{
		"transceiver":  "cluster: 1\npod: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\ngossip:\n" + gossip,
		"clusterrelay": "cluster: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\ncluster_gossip:\n" + gossip + "global_gossip:\n" + gossip,
		"globalrelay":  "pop: 1\npublic_addr: 127.0.0.1:0\ninternal_addr: 127.0.0.1\ngossip:\n" + gossip,
		"signaling":    "listen_addr: 127.0.0.1:0\ncatalogue: c.yaml\nallow_anonymous: true\n",
	}
	mk := map[string]func() validated{
		"transceiver":  func() validated { return &transceiver.Config{} },
		"clusterrelay": func() validated { return &clusterrelay.Config{} },
		"globalrelay":  func() validated { return &globalrelay.Config{} },
		"signaling":    func() validated { return &signaling.Config{} },
	}
	for _, tc := range []struct{ role, extra, want string }{
		{"transceiver", "", ""},
		{"transceiver", "idle_timeout: -1s\n", "idle_timeout"},
		{"transceiver", "connect_timeout: -5s\n", "connect_timeout"},
		{"transceiver", "max_sessions: -1\n", "max_sessions"},
		{"transceiver", "drain_timeout: -1m\n", "drain_timeout"},
		{"transceiver", "backend_addr: nohost\n", "backend_addr"},
		{"transceiver", "backend_url: wss://api.openai.com/v1/realtime?model=gpt-realtime\nbackend_protocol: beta\nbackend_rate: 16000\n", ""},
		{"transceiver", "backend_url: http://127.0.0.1:9600/v1/realtime\n", "backend_url: realtime: backend URL must be ws://"},
		{"transceiver", "backend_url: ws://user:sk-x@127.0.0.1:9600/v1/realtime\n", "RTCEDGE_BACKEND_API_KEY"},
		{"transceiver", "backend_url: ws://127.0.0.1:9600/v1/realtime\nbackend_addr: 127.0.0.1:9500\n", "backend_url and backend_addr are exclusive"},
		{"transceiver", "backend_protocol: beta\n", "need backend_url"},
		{"transceiver", "backend_url: ws://127.0.0.1:9600/v1/realtime\nbackend_protocol: v2\n", `protocol "v2"`},
		{"transceiver", "backend_url: ws://127.0.0.1:9600/v1/realtime\nbackend_rate: 44100\n", "rate 44100"},
		{"transceiver", "metrics_addr: \"localhost\"\n", "metrics_addr"},
		{"clusterrelay", "", ""},
		{"clusterrelay", "batch: -2\n", "batch"},
		{"clusterrelay", "api_addr: \"\"\n", "api_addr"},
		{"globalrelay", "", ""},
		{"globalrelay", "flow_idle: -1s\n", "flow_idle"},
		{"globalrelay", "max_flows: -1\n", "max_flows"},
		{"globalrelay", "workers: -1\n", "workers"},
		{"globalrelay", "internal_addr: somewhere\n", "internal_addr"},
		{"globalrelay", "public_addr: 3478\n", "public_addr"},
		{"globalrelay", "token_lifetime: 30m\n", "token_lifetime"},
		{"globalrelay", "clusters: [1, 2]\n", "served cluster 2"},
		{"transceiver", "cluster: 2\n", "hop key for cluster 2"},
		{"signaling", "", ""},
		{"signaling", "rate_per_second: -1\n", "rate_per_second"},
		{"signaling", "rate_burst: -3\n", "rate_burst"},
		{"signaling", "client_secret_ttl: -1m\n", "client_secret_ttl"},
		{"signaling", "drain_delay: -1s\n", "drain_delay"},
		{"signaling", "trusted_proxies: [\"10.0.0.0\"]\n", "trusted_proxies"},
		{"signaling", "gossip:\n  bind: nowhere\n", "gossip.bind"},
	} {
		t.Run(tc.role+"/"+strings.TrimSpace(tc.extra), func(t *testing.T) {
			cfg := mk[tc.role]()
			if err := config.Decode([]byte(base[tc.role]), cfg); err != nil {
				t.Fatal(err)
			}
			if err := config.Decode([]byte(tc.extra), cfg); err != nil {
				t.Fatal(err)
			}
			if e, ok := cfg.(interface{ ApplyEnv() error }); ok {
				if err := e.ApplyEnv(); err != nil {
					t.Fatal(err)
				}
			}
			cfg.Defaults()
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid config rejected: %v", err)
			case tc.want != "" && err == nil:
				t.Fatal("accepted")
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not name %s", err, tc.want)
			}
		})
	}
}
