package node

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// KeysReload is how often a node re-reads its key files (hop_keys.file,
// authority.file, pod_keys) by default (Env.KeysReload); SIGHUP makes it
// look at once.
const KeysReload = 5 * time.Second

// Results of a key file reload (rtcedge_key_reloads_total's result).
const (
	reloadOK         = "ok"         // a changed, valid file applied
	reloadInvalid    = "invalid"    // a changed file refused: the keys in use stay
	reloadUnreadable = "unreadable" // the file could not be read: the keys in use stay
)

// reloadCounter is the node's rtcedge_key_reloads_total, registered once
// per registerer (every watcher of a node shares it).
func reloadCounter(env Env) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtcedge_key_reloads_total",
		Help: "Key file reloads by file (hop_keys, authority, pod_keys) and result: ok (a changed, valid file applied), invalid (a changed file refused, counted once per content: the keys in use stay), unreadable (counted once until the file reads again)."},
		[]string{"keys", "result"})
	if err := env.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
	}
	return c
}

// WatchFile re-reads path every env.KeysReload (default KeysReload), and
// at once on SIGHUP, until ctx ends, and hands every content that differs
// from the last applied (last: what the node started with; nil: the first
// read counts as a change) to apply. A content apply refuses, or a file
// that cannot be read, keeps the keys in use: it is logged and counted
// once (per distinct content, per spell of unreadability), not on every
// look. what names the file in logs and in rtcedge_key_reloads_total.
func WatchFile(ctx context.Context, path, what string, last []byte, env Env, apply func([]byte) error) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return watchFile(ctx, path, what, last, env, hup, apply)
}

func watchFile(ctx context.Context, path, what string, last []byte, env Env, hup <-chan os.Signal, apply func([]byte) error) error {
	env = env.WithDefaults()
	period := env.KeysReload
	if period <= 0 {
		period = KeysReload
	}
	count := reloadCounter(env)
	for _, r := range []string{reloadOK, reloadInvalid, reloadUnreadable} {
		count.WithLabelValues(what, r)
	}
	log := env.Logger.With("keys", what, "file", path)
	tick := time.NewTicker(period)
	defer tick.Stop()
	var bad []byte // the last refused content
	unreadable := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-hup:
		}
		b, err := os.ReadFile(path)
		if err != nil {
			if !unreadable {
				unreadable = true
				count.WithLabelValues(what, reloadUnreadable).Inc()
				log.Error("key file unreadable; keeping the keys in use", "err", err)
			}
			continue
		}
		unreadable = false
		if (last != nil && bytes.Equal(b, last)) || (bad != nil && bytes.Equal(b, bad)) {
			continue
		}
		if err := apply(b); err != nil {
			bad = b
			count.WithLabelValues(what, reloadInvalid).Inc()
			log.Error("key file refused; keeping the keys in use", "err", err)
			continue
		}
		last, bad = b, nil
		count.WithLabelValues(what, reloadOK).Inc()
		log.Info("keys reloaded")
	}
}
