package node

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/testmetrics"
)

// TestWatchFileOnHangup: with a period too long to matter, a hangup makes
// the watcher look at once; a refused content and an unreadable file are
// each counted once however often the watcher looks, and keep what was
// applied; a good content after them is applied.
func TestWatchFileOnHangup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	write := func(s string) { // whole, as a Secret volume swaps it: a look sees the old or the new
		if err := os.WriteFile(path+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("one")
	reg := prometheus.NewRegistry()
	hup := make(chan os.Signal)
	applied := make(chan string, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- watchFile(ctx, path, "test", []byte("one"), Env{Registerer: reg, KeysReload: time.Hour, Logger: slog.New(slog.DiscardHandler)}, hup,
			func(b []byte) error {
				if string(b) == "bad" {
					return errors.New("bad keys")
				}
				applied <- string(b)
				return nil
			})
	}()
	defer func() { cancel(); <-done }()
	look := func() { hup <- os.Interrupt } // unbuffered: returns once the watcher takes it
	count := func(result string) float64 {
		return testmetrics.Take(t, reg)["rtcedge_key_reloads_total,keys=test,result="+result]
	}
	look() // unchanged: nothing
	write("two")
	look()
	if got := <-applied; got != "two" {
		t.Fatalf("applied %q, want two", got)
	}
	write("bad")
	look()
	look()
	look() // the third look waits for the second to finish
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	look()
	look()
	look()
	write("three")
	look()
	if got := <-applied; got != "three" {
		t.Fatalf("applied %q, want three", got)
	}
	look()
	for result, want := range map[string]float64{"ok": 2, "invalid": 1, "unreadable": 1} {
		if got := count(result); got != want {
			t.Errorf("%s reloads = %v, want %v", result, got, want)
		}
	}
	select {
	case got := <-applied:
		t.Errorf("also applied %q", got)
	default:
	}
}
