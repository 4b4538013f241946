package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rtcedge/rtcedge/probe"
)

// runProbe is `rtcedge probe`: one call by default, a continuous prober
// with -interval, a load generator with -sessions. See docs/probe.md.
func runProbe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "signaling base URL")
	path := fs.String("path", probe.DefaultPath, "offer endpoint (/v1/realtime/sdp or /v1/realtime/calls)")
	tok := fs.String("token", os.Getenv("RTCEDGE_TOKEN"), "bearer credential (default $RTCEDGE_TOKEN)")
	transport := fs.String("transport", probe.TransportUDP, "candidates to use: udp, tcp (ICE-TCP through the POPs' TCP ports only, as from a UDP-blocked network) or any")
	dur := fs.Duration("duration", 5*time.Second, "one-shot and continuous: how long each call stays up after its first echo; load: how long the full load lasts after the ramp")
	asJSON := fs.Bool("json", false, "print JSON: the report (one-shot, load) or one object per call (continuous)")
	setupTimeout := fs.Duration("setup-timeout", probe.DefaultSetupTimeout, "bound on each call's setup, offer to first echo")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	turns := fs.Int("turns", 0, "one-shot and continuous: talk instead of echo (docs/probe.md): this many turns, then a barge-in turn; measures each reply (works against the echo and the Realtime backends)")
	speech := fs.Duration("speech", time.Second, "with -turns: how long each turn talks")
	reportRTT := fs.Bool("report-rtt", false, "one-shot and continuous: post each call's echo round trip through its POP to signaling's steering table (the -token must be an API key with probe: true; docs/steering.md)")

	interval := fs.Duration("interval", 0, "continuous mode: place a call every interval (e.g. 30s)")
	count := fs.Int("count", 0, "continuous mode: stop after this many calls (0 = until interrupted)")
	metricsAddr := fs.String("metrics", "", "continuous mode: serve Prometheus /metrics on this address (e.g. 127.0.0.1:9091)")

	sessions := fs.Int("sessions", 0, "load mode: number of concurrent sessions")
	ramp := fs.Duration("ramp", 0, "load mode: spread the session starts over this time")
	htmlOut := fs.String("html", "", "load mode: also write a self-contained HTML report to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *interval > 0 && *sessions > 0 {
		return errors.New("-interval (continuous) and -sessions (load) are different modes; choose one")
	}
	if *htmlOut != "" && *sessions == 0 {
		return errors.New("-html needs load mode (-sessions)")
	}
	if *metricsAddr != "" && *interval == 0 {
		return errors.New("-metrics needs continuous mode (-interval)")
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	call := probe.Config{SignalingURL: *url, Path: *path, Token: *tok, Transport: *transport, Logger: log}
	if *turns > 0 {
		if *sessions > 0 {
			return errors.New("-turns needs one-shot or continuous mode, not load (-sessions)")
		}
		call.Talk = &probe.TalkConfig{Turns: *turns, Speech: *speech}
	}
	switch {
	case *sessions > 0:
		return probeLoad(ctx, probe.LoadConfig{Call: call, Sessions: *sessions, Duration: *dur, Ramp: *ramp, SetupTimeout: *setupTimeout}, *asJSON, *htmlOut)
	case *interval > 0:
		return probeContinuous(ctx, probe.ContinuousConfig{Call: call, Interval: *interval, Hold: *dur, SetupTimeout: *setupTimeout, Iterations: *count},
			*metricsAddr, *asJSON, *reportRTT, log)
	}
	rep, err := probe.Once(ctx, call, *dur)
	if err != nil {
		return err
	}
	if *reportRTT {
		if err := probe.ReportRTT(ctx, call, rep); err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	fmt.Print(rep.String())
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// probeLoad runs a load with a live progress line on stderr and prints the
// final report.
func probeLoad(ctx context.Context, cfg probe.LoadConfig, asJSON bool, htmlPath string) error {
	var htmlFile *os.File
	if htmlPath != "" {
		// Create the file first: a typo in the path should not cost a run.
		f, err := os.Create(htmlPath)
		if err != nil {
			return fmt.Errorf("HTML report: %w", err)
		}
		defer f.Close()
		htmlFile = f
	}
	cfg.Progress = func(p probe.LoadProgress) { fmt.Fprintf(os.Stderr, "\r\033[K%s", p) }
	rep, err := probe.Load(ctx, cfg)
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return err
	}
	if asJSON {
		err = writeJSON(os.Stdout, rep)
	} else {
		fmt.Print(rep.String())
	}
	if err != nil {
		return err
	}
	if htmlFile != nil {
		if err := rep.WriteHTML(htmlFile); err != nil {
			return err
		}
		if err := htmlFile.Close(); err != nil {
			return fmt.Errorf("HTML report: %w", err)
		}
		fmt.Fprintf(os.Stderr, "HTML report written to %s\n", htmlPath)
	}
	switch {
	case rep.Failed > 0:
		return fmt.Errorf("%d of %d sessions failed", rep.Failed, rep.Sessions)
	case rep.Interrupted:
		return errors.New("interrupted before the end of the run")
	}
	return nil
}

// probeContinuous runs the prober until ctx ends, serving its metrics on
// metricsAddr when set and printing one line (or JSON object) per call.
func probeContinuous(ctx context.Context, cfg probe.ContinuousConfig, metricsAddr string, asJSON, reportRTT bool, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := probe.NewMetrics(reg)
	if err != nil {
		return err
	}
	cfg.Metrics = m
	if metricsAddr != "" {
		ln, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		fmt.Fprintf(os.Stderr, "probe metrics on http://%s/metrics\n", ln.Addr())
	}
	cfg.OnResult = func(r probe.Report, err error) {
		now := time.Now().UTC().Format(time.RFC3339)
		switch {
		case asJSON:
			line := struct {
				Time   string        `json:"time"`
				Error  string        `json:"error,omitempty"`
				Reason string        `json:"reason,omitempty"`
				Report *probe.Report `json:"report,omitempty"`
			}{Time: now}
			if err != nil {
				line.Error, line.Reason = err.Error(), probe.FailureReason(err)
			} else {
				line.Report = &r
			}
			_ = json.NewEncoder(os.Stdout).Encode(line)
		case err != nil:
			fmt.Printf("%s  FAIL %s: %v\n", now, probe.FailureReason(err), err)
		case r.Turns != nil:
			fmt.Printf("%s  ok   %s/%s/%s  signaling %.1f ms  DTLS %.1f ms  %s\n", now, r.Region, r.POP, r.Cluster, r.SignalingMs, r.DTLSMs, probe.TurnSummary(r.Turns))
		default:
			fmt.Printf("%s  ok   %s/%s/%s  signaling %.1f ms  first echo %.1f ms  rtt p50 %.2f ms p99 %.2f ms  jitter %.2f ms  loss %.2f%%\n",
				now, r.Region, r.POP, r.Cluster, r.SignalingMs, r.FirstEchoMs, r.RTTP50Ms, r.RTTP99Ms, r.JitterMs, 100*r.LossRatio)
		}
	}
	if show := cfg.OnResult; reportRTT {
		cfg.OnResult = func(r probe.Report, err error) {
			show(r, err)
			if err == nil {
				if err := probe.ReportRTT(ctx, cfg.Call, r); err != nil {
					log.Warn("round trip not reported", "err", err)
				}
			}
		}
	}
	return probe.Continuous(ctx, cfg)
}
