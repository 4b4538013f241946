// Command rtcedge is the one binary of rtcedge: a subcommand per role
// (signaling, sipfront, transceiver, clusterrelay, globalrelay), plus dev, which runs
// the whole system on loopback, and probe, the synthetic client.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string) error
}

var commands = []command{
	{"dev", "run the whole multi-region system on loopback with the demo page", runDev},
	{"probe", "place synthetic calls and measure them", runProbe},
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: rtcedge <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(os.Stderr, "\nrtcedge <command> -h lists a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	name := os.Args[1]
	for _, c := range commands {
		if c.name != name {
			continue
		}
		ctx, stop := signalContext()
		defer stop()
		if err := c.run(ctx, os.Args[2:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				os.Exit(2)
			}
			fmt.Fprintf(os.Stderr, "rtcedge %s: %v\n", name, err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "rtcedge: unknown command %q\n\n", name)
	usage()
	os.Exit(2)
}

// signalContext is cancelled by the first SIGINT or SIGTERM (graceful
// stop, drain where the role drains); a second one exits at once.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-ch:
			slog.Info("stopping; send the signal again to exit at once", "signal", s.String())
			cancel()
		case <-ctx.Done():
			return
		}
		s := <-ch
		slog.Warn("second signal: exiting now", "signal", s.String())
		os.Exit(1)
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}

// newLogger returns a text logger at the named level.
func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
