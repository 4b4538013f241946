package transceiver

// Pion's loggers on the pod's slog logger: rate-limited, with Pion's
// warnings about I/O on closed connections demoted to debug, so that a
// teardown does not bury the warnings that matter.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/pion/logging"
	"golang.org/x/time/rate"
)

// pionLoggers routes Pion's scoped loggers into slog. Pion's Info level is
// chatty per session, so it maps to Debug; warnings and errors stay.
type pionLoggers struct{ log *slog.Logger }

func (f pionLoggers) NewLogger(scope string) logging.LeveledLogger {
	return pionLogger{log: f.log.With("pion", scope), lim: rate.NewLimiter(5, 20)}
}

// pionLogger rate-limits what it logs: Pion warns once per bad packet, and
// packets come from outside.
type pionLogger struct {
	log *slog.Logger
	lim *rate.Limiter
}

// warnLevel demotes Pion's warnings about I/O on closed conns: every
// session teardown produces a few, and at warn level they would bury the
// warnings that matter.
func warnLevel(format string, args []any) slog.Level {
	if strings.Contains(format, "closed") {
		return slog.LevelDebug
	}
	for _, a := range args {
		if err, ok := a.(error); ok && (errors.Is(err, io.ErrClosedPipe) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "closed")) {
			return slog.LevelDebug
		}
	}
	return slog.LevelWarn
}

func (l pionLogger) logf(level slog.Level, format string, args ...any) {
	if !l.log.Enabled(context.Background(), level) || !l.lim.Allow() {
		return
	}
	l.log.Log(context.Background(), level, fmt.Sprintf(format, args...))
}

func (l pionLogger) Trace(msg string)                  {}
func (l pionLogger) Tracef(string, ...any)             {}
func (l pionLogger) Debug(msg string)                  { l.logf(slog.LevelDebug-4, "%s", msg) }
func (l pionLogger) Debugf(format string, args ...any) { l.logf(slog.LevelDebug-4, format, args...) }
func (l pionLogger) Info(msg string)                   { l.logf(slog.LevelDebug, "%s", msg) }
func (l pionLogger) Infof(format string, args ...any)  { l.logf(slog.LevelDebug, format, args...) }
func (l pionLogger) Warn(msg string)                   { l.Warnf("%s", msg) }
func (l pionLogger) Warnf(format string, args ...any) {
	l.logf(warnLevel(format, args), format, args...)
}
func (l pionLogger) Error(msg string)                  { l.logf(slog.LevelError, "%s", msg) }
func (l pionLogger) Errorf(format string, args ...any) { l.logf(slog.LevelError, format, args...) }
