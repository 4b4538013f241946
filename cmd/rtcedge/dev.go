// The dev subcommand: the whole system on loopback (devworld), open to any
// API key, over HTTPS and WSS with -tls.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/rtcedge/rtcedge/devworld"
)

// prefixes is a repeatable -flag of CIDR prefixes.
type prefixes []netip.Prefix

func (p *prefixes) String() string {
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

func (p *prefixes) Set(v string) error {
	x, err := netip.ParsePrefix(v)
	if err != nil {
		return err
	}
	*p = append(*p, x)
	return nil
}

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	httpAddr := fs.String("http", "127.0.0.1:8080", "signaling and demo page listen address")
	sipAddr := fs.String("sip", "127.0.0.1:5060", "SIP front's UDP and TCP listen address (empty: none)")
	metricsAddr := fs.String("metrics", "127.0.0.1:9090", "Prometheus /metrics listen address (empty: none)")
	popPort := fs.Uint("pop-port", 3478, "UDP port of every POP VIP (127.0.0.2, 127.0.0.3, ...); 0 = any")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error (info shows gossip and session events)")
	redisURL := fs.String("redis", "", "Redis URL for the global relays' route cache (default: an in-process store)")
	geoip := fs.String("geoip", "", "GeoLite2/GeoIP2 City .mmdb file for steering (default: a tiny embedded one)")
	backend := fs.String("backend", "", "the pods' backend: empty for the echo, ws://HOST:PORT/v1/realtime?model=… for an OpenAI Realtime server (key from $RTCEDGE_BACKEND_API_KEY), or ref to start the reference server")
	protocol := fs.String("backend-protocol", "", "with -backend: ga (default) or beta")
	rate := fs.Int("backend-rate", 0, "with -backend: the server's PCM16 rate, 24000 (default) or 16000")
	useTLS := fs.Bool("tls", false, "serve signaling (API, sideband, demo page) over HTTPS and WSS with a generated certificate, for OpenAI's SDK, whose sideband speaks wss: only")
	tlsDir := fs.String("tls-dir", "", "with -tls: where the certificate and its CA are written (default: rtcedge/dev-tls in the user's cache directory)")
	var trusted prefixes
	fs.Var(&trusted, "trust-proxy", "CIDR whose CF-Connecting-IP / CF-IPLatitude headers signaling believes, e.g. 127.0.0.0/8 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *popPort > 65535 {
		return fmt.Errorf("pop-port %d out of range", *popPort)
	}
	env, err := processEnv(*logLevel)
	if err != nil {
		return err
	}
	url, about, err := devBackend(ctx, *backend, *protocol, *rate, env)
	if err != nil {
		return err
	}
	dir := ""
	if *useTLS {
		if dir, err = devTLSDir(*tlsDir); err != nil {
			return err
		}
	}
	w, err := devworld.Start(devworld.Config{
		HTTPAddr: *httpAddr, SIPAddr: *sipAddr, MetricsAddr: *metricsAddr, POPPort: uint16(*popPort), RedisURL: *redisURL,
		GeoIPDB: *geoip, TrustedProxies: trusted, Logger: env.Logger,
		BackendURL: url, BackendProtocol: *protocol, BackendRate: *rate,
		AnyAPIKey: true, TLSDir: dir,
	})
	if err != nil {
		return err
	}
	fmt.Fprint(os.Stdout, w.String())
	what := map[string]string{"": ": you hear yourself back through the relays",
		"ref": ", speak, then pause: the reference server plays your words back through the relays"}[*backend]
	if what == "" {
		what = " and speak: the model answers through the relays"
	}
	fmt.Fprintf(os.Stdout, "%s\n\nOpen %s in a browser and press Call%s.\n", about, w.SignalingURL, what)
	<-ctx.Done()
	env.Logger.Info("stopping dev world")
	return w.Close()
}

// devTLSDir is the directory `rtcedge dev -tls` writes its certificate to:
// dir, or rtcedge/dev-tls in the user's cache directory, created if needed.
func devTLSDir(dir string) (string, error) {
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("-tls: no cache directory for the certificate (set -tls-dir): %w", err)
		}
		dir = filepath.Join(cache, "rtcedge", "dev-tls")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("-tls-dir: %w", err)
	}
	return dir, nil
}
