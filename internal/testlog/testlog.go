// Package testlog gives tests one logger: quiet, unless RTCEDGE_TEST_LOG=debug
// asks for everything on stderr (the way to read a failing end-to-end
// test's component logs).
package testlog

import (
	"log/slog"
	"os"
)

// Logger returns the test logger.
func Logger() *slog.Logger {
	if os.Getenv("RTCEDGE_TEST_LOG") == "debug" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
