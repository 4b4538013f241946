package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/rtcedge/rtcedge/backend/realtime"
	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/internal/node"
)

func init() {
	commands = append(commands, command{"realtime-ref",
		"run the reference OpenAI Realtime server (parrot replies) to try the edge without a model", runRealtimeRef})
}

// runRealtimeRef serves refserver on -addr and prints its URL, the
// transceiver's backend_url (docs/backends.md, "The reference server").
func runRealtimeRef(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("realtime-ref", flag.ContinueOnError)
	var cfg refserver.Config
	fs.StringVar(&cfg.Addr, "addr", refserver.DefaultAddr, "listen address")
	fs.BoolVar(&cfg.Beta, "beta", false, "send the beta event names and session shape (response.audio.delta, …)")
	fs.IntVar(&cfg.Rate, "rate", 24000, "PCM16 sample rate of the audio: 24000 or 16000 (a transceiver needs the same backend_rate)")
	fs.StringVar(&cfg.APIKey, "api-key", "", "the only API key accepted (default $"+realtime.APIKeyEnv+", which the pods send; empty: none required)")
	fs.IntVar(&cfg.MaxReplyMs, "max-reply-ms", 0, "cap on a reply's audio in ms (0: the server's default, 30000)")
	fs.IntVar(&cfg.RecordMs, "record-ms", 0, "input audio each session keeps for inspection in ms (0: none)")
	fs.IntVar(&cfg.MaxInputMs, "max-input-ms", 0, "cap on a session's input audio buffer in ms, the oldest audio dropped past it (0: the server's default, 30000)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv(realtime.APIKeyEnv)
	}
	env, err := processEnv(*logLevel)
	if err != nil {
		return err
	}
	cfg.Logger = env.Logger
	srv, err := refserver.New(cfg, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "Realtime reference server at %s?model=ref (%s, %d Hz)\n", srv.URL(), protocolName(cfg.Beta), cfg.Rate)
	return srv.Run(ctx)
}

func protocolName(beta bool) string {
	if beta {
		return realtime.ProtocolBeta
	}
	return realtime.ProtocolGA
}

// devBackend is `rtcedge dev -backend`: "" (the echo), a Realtime server's
// URL, or "ref" for a reference server started here on a free loopback
// port (it serves until ctx ends). It returns the URL for the pods and a
// line saying what they talk to.
func devBackend(ctx context.Context, backend, protocol string, rate int, env node.Env) (url, about string, err error) {
	switch backend {
	case "":
		return "", "backend: the in-process echo", nil
	case "ref":
		srv, err := refserver.New(refserver.Config{Addr: "127.0.0.1:0", Beta: protocol == realtime.ProtocolBeta, Rate: rate, Logger: env.Logger}, nil)
		if err != nil {
			return "", "", err
		}
		go func() { _ = srv.Run(ctx) }()
		url = srv.URL() + "?model=ref"
		return url, fmt.Sprintf("backend: the Realtime reference server (parrot replies, %s) at %s", protocolName(protocol == realtime.ProtocolBeta), url), nil
	}
	return backend, "backend: the Realtime server at " + realtime.RedactURL(backend), nil
}
