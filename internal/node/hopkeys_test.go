package node

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
)

func hopSpec(cluster string, id string, fill byte) string {
	return cluster + "/" + id + ":" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, encap.KeyLen))
}

// TestWatchHopKeysRotates: a node given hop_keys.file picks up a changed,
// valid key set without a restart, and keeps the keys in use when the file
// becomes invalid.
func TestWatchHopKeysRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hop_keys")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(hopSpec("7", "1", 1) + "\n")
	k := HopKeys{File: path, Keys: []string{"ignored when a file is set"}}
	first, err := k.ClusterKeys()
	if err != nil || first.For(7).CurrentKeyID() != 1 {
		t.Fatalf("ClusterKeys from file = %v, %v", first, err)
	}
	got := make(chan *encap.ClusterKeys, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchHopKeys(ctx, k, Env{KeysReload: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, func(c *encap.ClusterKeys) error { got <- c; return nil })
	}()
	defer func() { cancel(); <-done }()
	write("7/garbage\n") // invalid: ignored
	write(hopSpec("7", "2", 2) + "," + hopSpec("7", "1", 1) + "\n")
	select {
	case c := <-got:
		if c.For(7).CurrentKeyID() != 2 {
			t.Fatalf("reloaded current key ID %d, want 2", c.For(7).CurrentKeyID())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("changed key file not applied")
	}
	select {
	case c := <-got:
		if c.For(7).CurrentKeyID() != 2 {
			t.Fatalf("an unchanged or invalid file was applied: %v", c)
		}
	default:
	}
	if err := WatchHopKeys(ctx, HopKeys{}, Env{}, nil); err != nil {
		t.Fatalf("without a file: %v", err)
	}
}

// TestAdvertisedUnmapped: an advertised address written as ::ffff:a.b.c.d
// is used (and gossiped) as plain IPv4, the form every packet source has.
func TestAdvertisedUnmapped(t *testing.T) {
	ap, err := Advertised("data", netip.MustParseAddrPort("127.0.0.1:1"), "[::ffff:10.1.2.3]:7000")
	if err != nil || ap != netip.MustParseAddrPort("10.1.2.3:7000") {
		t.Fatalf("Advertised = %v, %v; want 10.1.2.3:7000", ap, err)
	}
}

// TestWatchHopKeysChangeBeforeStart: a key file changed after the node
// built its keys but before its watcher took its first look is applied,
// not taken for the baseline.
func TestWatchHopKeysChangeBeforeStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hop_keys")
	if err := os.WriteFile(path, []byte(hopSpec("7", "1", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := HopKeys{File: path}
	if _, err := k.ClusterKeys(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(hopSpec("7", "2", 2)+","+hopSpec("7", "1", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan *encap.ClusterKeys, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchHopKeys(ctx, k, Env{KeysReload: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, func(c *encap.ClusterKeys) error { got <- c; return nil })
	}()
	defer func() { cancel(); <-done }()
	select {
	case c := <-got:
		if c.For(7).CurrentKeyID() != 2 {
			t.Fatalf("applied current key ID %d, want 2", c.For(7).CurrentKeyID())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the key file changed before the watcher started was never applied")
	}
}
