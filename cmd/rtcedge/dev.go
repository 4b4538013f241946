package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/routecache"
)

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	httpAddr := fs.String("http", "127.0.0.1:8080", "signaling and demo page listen address")
	metricsAddr := fs.String("metrics", "127.0.0.1:9090", "Prometheus /metrics listen address (empty: none)")
	popPort := fs.Uint("pop-port", 3478, "UDP port of every POP VIP (127.0.0.2, 127.0.0.3, ...); 0 = any")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error (info shows gossip and session events)")
	redisURL := fs.String("redis", "", "Redis URL for the global relays' route cache (default: an in-process store)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *popPort > 65535 {
		return fmt.Errorf("pop-port %d out of range", *popPort)
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	routecache.SetRedisLogger(log)
	w, err := devworld.Start(devworld.Config{
		HTTPAddr: *httpAddr, MetricsAddr: *metricsAddr, POPPort: uint16(*popPort), RedisURL: *redisURL, Logger: log,
	})
	if err != nil {
		return err
	}
	fmt.Fprint(os.Stdout, w.String())
	fmt.Fprintf(os.Stdout, "\nOpen %s in a browser and press Call: you hear yourself back through the relays.\n", w.SignalingURL)
	<-ctx.Done()
	log.Info("stopping dev world")
	return w.Close()
}
