package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rtcedge/rtcedge/backend/netbackend"
	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/signaling"
	"github.com/rtcedge/rtcedge/sipfront"
	"github.com/rtcedge/rtcedge/transceiver"
)

func init() {
	commands = append(commands,
		roleCommand("signaling", "run the geo-aware HTTP front (POST /v1/realtime/sdp)", onSockets(signaling.OpenSockets, signaling.NewNode)),
		roleCommand("transceiver", "run a transceiver pod (WebRTC termination, bridged to its backend)",
			func(cfg *transceiver.Config, env node.Env) (runner, error) {
				podGC()
				b, err := cfg.NewBackend(os.Getenv, env.Logger, env.Registerer)
				if err != nil {
					return nil, err
				}
				socks, err := transceiver.OpenSockets(*cfg)
				if err != nil {
					return nil, err
				}
				return transceiver.NewNode(*cfg, socks, b, env)
			}),
		roleCommand("clusterrelay", "run a cluster relay replica and the cluster's session API front", onSockets(clusterrelay.OpenSockets, clusterrelay.NewNode)),
		roleCommand("globalrelay", "run a global relay replica (a POP's public UDP ingress)", onSockets(globalrelay.OpenSockets, globalrelay.NewNode)),
		roleCommand("sipfront", "run the SIP front (phone calls from carrier trunks, docs/sip.md)", onSockets(sipfront.OpenSockets, sipfront.NewNode)),
		command{"backend", "run the reference echo backend over the network backend protocol", runBackend},
	)
}

// runner is a role's node.
type runner interface {
	Run(ctx context.Context) error
}

// onSockets builds a role's node with build on the sockets open opens.
func onSockets[C, S any, N runner](open func(C) (S, error), build func(C, S, node.Env) (N, error)) func(*C, node.Env) (runner, error) {
	return func(cfg *C, env node.Env) (runner, error) {
		s, err := open(*cfg)
		if err != nil {
			return nil, err
		}
		return build(*cfg, s, env)
	}
}

// settings is what every role's config has (it embeds node.Common).
type settings interface{ Settings() *node.Common }

// roleCommand is a role's subcommand: it loads -config strictly into a C
// (secrets from the environment), sets up logging and a metric registry,
// builds the node with build and runs it until the first signal.
func roleCommand[C any](name, summary string, build func(*C, node.Env) (runner, error)) command {
	return command{name, summary, func(ctx context.Context, args []string) error {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		path := fs.String("config", "", "YAML config file (see docs/operations.md); secrets come from the environment")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if *path == "" {
			return errors.New("-config is required")
		}
		var cfg C
		if err := config.Load(*path, &cfg); err != nil {
			return err
		}
		common := any(&cfg).(settings).Settings()
		common.Defaults()
		env, err := processEnv(common.LogLevel)
		if err != nil {
			return err
		}
		n, err := build(&cfg, env)
		if err != nil {
			return err
		}
		return n.Run(ctx)
	}}
}

// processEnv is the environment of the process's one node: a text logger
// at level (also the default and go-redis's logger) and a registry with
// the Go and process collectors, served on the node's metrics listener.
func processEnv(level string) (node.Env, error) {
	log, err := newLogger(level)
	if err != nil {
		return node.Env{}, err
	}
	slog.SetDefault(log)
	routecache.SetRedisLogger(log)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return node.Env{Logger: log, Registerer: reg, Gatherer: reg}, nil
}

// runBackend serves the reference echo backend over the network protocol
// that transceivers with backend_addr speak (docs/backend-protocol.md).
func runBackend(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("backend", flag.ContinueOnError)
	var cfg netbackend.NodeConfig
	fs.StringVar(&cfg.Listen, "listen", netbackend.DefaultListen, "TCP address transceivers connect to")
	fs.StringVar(&cfg.MetricsAddr, "metrics", "", "address of /livez and /readyz (and /metrics); empty: none")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	env, err := processEnv(cfg.LogLevel)
	if err != nil {
		return err
	}
	n, err := netbackend.NewNode(cfg, nil, nil, env)
	if err != nil {
		return err
	}
	return n.Run(ctx)
}

// podGCPercent is a transceiver pod's GOGC unless the environment sets one.
// The pod's per-packet path allocates nothing, so collections are rare and
// cheap, while the garbage the default (100) lets accumulate is about a
// tenth of the pod's memory per session: measured once (docs/benchmarks.md,
// "Transceiver capacity"), 261 KiB RSS per session at GOGC=100 and 234 KiB
// at 50, with the same CPU per session.
const podGCPercent = 50

func podGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(podGCPercent)
	}
}
