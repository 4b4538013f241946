// The SIP library's log lines: a parse failure is counted, never logged
// one by one (a flood of garbage would otherwise flood the log); the rest
// reach the front's logger at a bounded rate.

package sipfront

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// logLimiter is an slog.Handler for sipgo. Static after newLogLimiter;
// safe for concurrent use.
type logLimiter struct {
	next      *slog.Logger
	malformed prometheus.Counter
	limit     *rate.Limiter
}

func newLogLimiter(next *slog.Logger, malformed prometheus.Counter) *logLimiter {
	return &logLimiter{next: next, malformed: malformed, limit: rate.NewLimiter(rate.Every(time.Second), 5)}
}

// Enabled takes warnings and errors only: sipgo's debug and info lines
// are per message.
func (l *logLimiter) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn
}

// Handle counts a parse failure, and passes anything else on while the
// rate allows.
func (l *logLimiter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(strings.ToLower(r.Message), "parse") {
		l.malformed.Inc()
		return nil
	}
	if !l.limit.Allow() {
		return nil
	}
	attrs := []any{}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "data" { // never the message bytes a sender chose
			attrs = append(attrs, a)
		}
		return true
	})
	l.next.Log(ctx, r.Level, r.Message, attrs...)
	return nil
}

// WithAttrs and WithGroup keep the handler as it is: sipgo's scoped
// attributes add nothing the front needs.
func (l *logLimiter) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup: see WithAttrs.
func (l *logLimiter) WithGroup(string) slog.Handler { return l }
