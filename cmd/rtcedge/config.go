package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.yaml.in/yaml/v3"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/token"
)

// Environment variables that carry secrets, so config files need none.
const (
	envTokenKeys    = "RTCEDGE_TOKEN_KEYS"    // "ID:BASE64[,ID:BASE64...]"
	envTokenCurrent = "RTCEDGE_TOKEN_CURRENT" // key ID that mints
	// envHopKeys holds the inter-tier MAC keys, "CLUSTER/ID:BASE64[,...]":
	// a global relay needs every cluster it serves, a transceiver or
	// cluster relay uses its own cluster's (and should be given only
	// those). Per cluster the first key listed signs; all are accepted.
	envHopKeys   = "RTCEDGE_HOP_KEYS"
	envGossipKey = "RTCEDGE_GOSSIP_KEY" // base64, 16/24/32 bytes
	envAPIKeys   = "RTCEDGE_API_KEYS"   // comma-separated
	envSecretKey = "RTCEDGE_CLIENT_SECRET_KEY"
)

// Common holds settings every role has.
type Common struct {
	LogLevel    string `yaml:"log_level"`    // debug, info, warn, error
	MetricsAddr string `yaml:"metrics_addr"` // Prometheus /metrics and pprof-free health; "" = none
	// DrainTimeout bounds a graceful stop after the first SIGTERM.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

// Gossip configures one memberlist pool.
type Gossip struct {
	Name      string   `yaml:"name"`      // default: hostname (+ a suffix per pool)
	Bind      string   `yaml:"bind"`      // e.g. 0.0.0.0:7946
	Advertise string   `yaml:"advertise"` // address others reach us at; default: bind
	Join      []string `yaml:"join"`      // seeds, e.g. a headless Service name
	// Key is the base64 gossip encryption key; prefer $RTCEDGE_GOSSIP_KEY.
	Key      string `yaml:"key"`
	Insecure bool   `yaml:"insecure"` // allow no key (dev only)
	Fast     bool   `yaml:"fast"`     // loopback-tight timings (tests, dev)
}

// TokenKeys configures the routing-token keyring.
type TokenKeys struct {
	// Keys are "ID:BASE64" specs; prefer $RTCEDGE_TOKEN_KEYS.
	Keys    []string `yaml:"keys"`
	Current *uint8   `yaml:"current"` // minting key ID; default the highest
}

// HopKeys configures the inter-tier datagram MAC keys (docs/wire.md).
type HopKeys struct {
	// Keys are key specs (see envHopKeys); prefer $RTCEDGE_HOP_KEYS.
	Keys []string `yaml:"keys"`
}

func (k HopKeys) specs() ([]string, error) {
	specs := k.Keys
	if env := os.Getenv(envHopKeys); env != "" {
		specs = strings.Split(env, ",")
	}
	for i := range specs {
		specs[i] = strings.TrimSpace(specs[i])
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("no inter-tier hop keys: set hop_keys.keys or $%s", envHopKeys)
	}
	return specs, nil
}

// keyring returns one cluster's hop keyring (transceiver, cluster relay).
func (k HopKeys) keyring(cluster uint16) (*encap.Keyring, error) {
	all, err := k.clusterKeys()
	if err != nil {
		return nil, err
	}
	if r := all.For(cluster); r != nil {
		return r, nil
	}
	return nil, fmt.Errorf("no inter-tier hop key for cluster %d in hop_keys.keys or $%s", cluster, envHopKeys)
}

// clusterKeys builds the hop keyrings of every cluster (global relay).
func (k HopKeys) clusterKeys() (*encap.ClusterKeys, error) {
	specs, err := k.specs()
	if err != nil {
		return nil, err
	}
	return encap.ParseClusterKeys(specs)
}

// loadConfig reads a YAML file strictly (unknown keys are errors) into v.
func loadConfig(path string, v any) error {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	data = expandEnv(data)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandEnv replaces ${VAR} in a config file with the environment's value,
// so a Kubernetes pod can advertise "${POD_IP}:7000" from the downward API.
// Only the braced form is expanded: a bare "$" stays as written.
func expandEnv(data []byte) []byte {
	return envRef.ReplaceAllFunc(data, func(m []byte) []byte {
		return []byte(os.Getenv(string(m[2 : len(m)-1])))
	})
}

func (c *Common) defaults() {
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 5 * time.Minute
	}
}

// keyring builds the token keyring from config and environment.
func (k TokenKeys) keyring() (*token.Keyring, error) {
	specs := k.Keys
	if env := os.Getenv(envTokenKeys); env != "" {
		specs = strings.Split(env, ",")
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("no routing-token keys: set token.keys or $%s", envTokenKeys)
	}
	keys := map[uint8][]byte{}
	var highest uint8
	for _, s := range specs {
		id, key, err := token.ParseKeySpec(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		keys[id] = key
		highest = max(highest, id)
	}
	cur := highest
	if k.Current != nil {
		cur = *k.Current
	}
	if env := os.Getenv(envTokenCurrent); env != "" {
		v, err := strconv.ParseUint(env, 10, 4)
		if err != nil {
			return nil, fmt.Errorf("$%s: %w", envTokenCurrent, err)
		}
		cur = uint8(v)
	}
	return token.NewKeyring(cur, keys)
}

// pool creates and joins a gossip pool. Joining is retried in the
// background when no seed answers yet (pods start in any order).
func (g Gossip) pool(ctx context.Context, suffix string, wan bool, meta membership.Meta, log *slog.Logger) (*membership.Pool, error) {
	name := g.Name
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, err
		}
		name = h
	}
	name += suffix
	bind, err := netip.ParseAddrPort(g.Bind)
	if err != nil {
		return nil, fmt.Errorf("gossip bind %q: %w", g.Bind, err)
	}
	var adv netip.AddrPort
	if g.Advertise != "" {
		if adv, err = netip.ParseAddrPort(g.Advertise); err != nil {
			return nil, fmt.Errorf("gossip advertise %q: %w", g.Advertise, err)
		}
	}
	keyB64 := g.Key
	if env := os.Getenv(envGossipKey); env != "" {
		keyB64 = env
	}
	var key []byte
	if keyB64 != "" {
		if key, err = base64.StdEncoding.DecodeString(keyB64); err != nil {
			return nil, fmt.Errorf("gossip key: %w", err)
		}
	}
	pool, err := membership.New(membership.Config{
		Name: name, Bind: bind, Advertise: adv, WAN: wan, SecretKey: key,
		AllowInsecure: g.Insecure, Fast: g.Fast, Logger: log,
	}, meta)
	if err != nil {
		return nil, err
	}
	if len(g.Join) > 0 {
		go func() {
			for delay := 200 * time.Millisecond; ; delay = min(delay*2, 10*time.Second) {
				if _, err := pool.Join(g.Join); err == nil {
					return
				} else {
					log.Warn("gossip join failed; retrying", "pool", name, "err", err, "in", delay)
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(delay):
				}
			}
		}()
	}
	return pool, nil
}

// metricsServer serves /metrics from reg plus Go and process collectors,
// and /livez and /readyz (ready unless draining reports true).
func metricsServer(addr string, reg *prometheus.Registry, log *slog.Logger, draining func() bool) (*http.Server, error) {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if addr == "" {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if draining != nil && draining() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return serve(addr, mux, log)
}

// serve starts an HTTP server with the project's timeouts.
func serve(addr string, h http.Handler, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 15 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "addr", addr, "err", err)
		}
	}()
	log.Info("listening", "addr", ln.Addr().String())
	return srv, nil
}

// advertisedURL is "http://" + adv, or the server's bound address when adv
// is empty (so port 0 works). A wildcard address is refused: gossiped to
// others, "0.0.0.0" would send their requests to themselves.
func advertisedURL(adv string, srv *http.Server) (string, error) {
	hostport := adv
	if hostport == "" {
		hostport = srv.Addr
	}
	ap, err := netip.ParseAddrPort(hostport)
	if err == nil && ap.Addr().IsUnspecified() {
		return "", fmt.Errorf("API address %s is not one others can reach: set api_advertise (e.g. \"${POD_IP}:%d\")", hostport, ap.Port())
	}
	return "http://" + hostport, nil
}

func shutdown(srvs ...*http.Server) {
	for _, s := range srvs {
		if s == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Shutdown(ctx)
		cancel()
	}
}

// podFromHostname derives a pod ID from a StatefulSet-style hostname
// ("transceiver-3" → 4), so a Kubernetes deployment needs no per-pod config.
func podFromHostname() (uint16, error) {
	h, err := os.Hostname()
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`-(\d+)$`).FindStringSubmatch(h)
	if m == nil {
		return 0, fmt.Errorf("pod ID not configured and hostname %q has no -N ordinal", h)
	}
	n, err := strconv.ParseUint(m[1], 10, 16)
	if err != nil || n >= 65535 {
		return 0, fmt.Errorf("hostname ordinal %q out of range", m[1])
	}
	return uint16(n + 1), nil
}

// parseAddr parses "host:port" for a UDP or TCP bind or advertised
// address. An IPv4-mapped IPv6 address is unmapped: packet sources are
// always plain IPv4, and an advertised mapped address would match none.
func parseAddr(what, s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%s %q: %w", what, s, err)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}
