package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rtcedge/rtcedge/probe"
)

func runProbe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "signaling base URL")
	path := fs.String("path", probe.DefaultPath, "offer endpoint (/v1/realtime/sdp or /v1/realtime/calls)")
	tok := fs.String("token", os.Getenv("RTCEDGE_TOKEN"), "bearer credential (default $RTCEDGE_TOKEN)")
	dur := fs.Duration("duration", 5*time.Second, "how long to keep the call up after the first echo")
	asJSON := fs.Bool("json", false, "print a JSON report")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	rep, err := probe.Once(ctx, probe.Config{SignalingURL: *url, Path: *path, Token: *tok, Logger: log}, *dur)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Print(rep.String())
	return nil
}
