package transceiver

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// NodeConfig is the transceiver role's config file (docs/operations.md).
// Zero durations and counts take the defaults of Config.
type NodeConfig struct {
	node.Common    `yaml:",inline"`
	Region         string        `yaml:"region"`
	Cluster        uint16        `yaml:"cluster"`
	Pod            uint16        `yaml:"pod"`       // 0: from the hostname's StatefulSet ordinal
	DataAddr       string        `yaml:"data_addr"` // pod UDP socket, e.g. 0.0.0.0:7000
	DataAdvertise  string        `yaml:"data_advertise"`
	APIAddr        string        `yaml:"api_addr"` // session API, e.g. 0.0.0.0:8081
	APIAdvertise   string        `yaml:"api_advertise"`
	MaxSessions    int           `yaml:"max_sessions"`
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	IdleTimeout    time.Duration `yaml:"idle_timeout"`
	RouteTTL       time.Duration `yaml:"route_ttl"` // a client's return route without packets; default 2m
	DTLSRole       string        `yaml:"dtls_role"` // client (a=setup:active) or server (a=setup:passive)
	// PionMedia keeps SRTP on Pion's own path instead of the pod's
	// (Config.PionMedia); for comparisons only.
	PionMedia bool `yaml:"pion_media"`
	// BackendAddr is the inference backend (host:port,
	// docs/backend-protocol.md); empty: the in-process echo backend.
	// netbackend.ForAddr turns it into the node's Backend.
	BackendAddr string         `yaml:"backend_addr"`
	Token       node.TokenKeys `yaml:"token"`
	// HopKeys are this cluster's inter-tier keys; prefer $RTCEDGE_HOP_KEYS.
	HopKeys node.HopKeys `yaml:"hop_keys"`
	Gossip  node.Gossip  `yaml:"gossip"` // the cluster pool
	// SessionAPISecret is the cluster's session API bearer secret (e.g.
	// "${RTCEDGE_SESSION_API_SECRET}"); empty: the API asks for none.
	SessionAPISecret string `yaml:"session_api_secret"`
	// SessionAPISecretSHA256 is the secret's hex SHA-256 instead (preferred:
	// the pod then never holds a credential that opens other pods).
	SessionAPISecretSHA256 string `yaml:"session_api_secret_sha256"`
	// APITLS serves the session API over TLS (cert, key); the front
	// verifies it with the cluster CA.
	APITLS sessionapi.TLS `yaml:"api_tls"`
}

// ApplyEnv takes the secrets from the environment (config.Load calls it).
func (c *NodeConfig) ApplyEnv() error {
	c.Gossip.ApplyEnv()
	c.HopKeys.ApplyEnv()
	return c.Token.ApplyEnv()
}

// Defaults fills the unset fields that are the node's own (the
// transceiver's are filled by New).
func (c *NodeConfig) Defaults() { c.Common.Defaults() }

// Validate checks c after Defaults.
func (c *NodeConfig) Validate() error {
	errs := []error{c.Common.Validate(),
		node.CheckHostPort("data_addr", c.DataAddr, false),
		node.CheckHostPort("api_addr", c.APIAddr, false),
		c.APITLS.Validate("api_tls"),
		checkSHA256("session_api_secret_sha256", c.SessionAPISecretSHA256),
		node.CheckHostPort("backend_addr", c.BackendAddr, true),
		node.NotNegative("max_sessions", c.MaxSessions),
		node.NotNegative("connect_timeout", c.ConnectTimeout),
		node.NotNegative("idle_timeout", c.IdleTimeout),
		node.NotNegative("route_ttl", c.RouteTTL),
		c.Gossip.Validate("gossip"),
	}
	if c.Cluster == 0 {
		errs = append(errs, errors.New("cluster must be non-zero"))
	}
	if c.DTLSRole != "" && c.DTLSRole != "client" && c.DTLSRole != "server" {
		errs = append(errs, fmt.Errorf("dtls_role %q: want client or server", c.DTLSRole))
	}
	if _, err := c.Token.Keyring(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.HopKeys.Keyring(c.Cluster); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("transceiver config: %w", err)
	}
	return nil
}

var ordinal = regexp.MustCompile(`-(\d+)$`)

// PodFromHostname derives a pod ID from a StatefulSet-style hostname
// ("transceiver-3" → 4), so a Kubernetes deployment needs no per-pod config.
func PodFromHostname(hostname string) (uint16, error) {
	m := ordinal.FindStringSubmatch(hostname)
	if m == nil {
		return 0, fmt.Errorf("pod ID not configured and hostname %q has no -N ordinal", hostname)
	}
	n, err := strconv.ParseUint(m[1], 10, 16)
	if err != nil || n >= 65535 {
		return 0, fmt.Errorf("hostname ordinal %q out of range", m[1])
	}
	return uint16(n + 1), nil
}

func podID(cfg *NodeConfig) error {
	if cfg.Pod != 0 {
		return nil
	}
	h, err := os.Hostname()
	if err != nil {
		return err
	}
	cfg.Pod, err = PodFromHostname(h)
	return err
}

// checkSHA256 accepts "" or 64 hex digits.
func checkSHA256(what, v string) error {
	if v == "" {
		return nil
	}
	if b, err := hex.DecodeString(v); err != nil || len(b) != 32 {
		return fmt.Errorf("%s: want the 64 hex digits of a SHA-256", what)
	}
	return nil
}
