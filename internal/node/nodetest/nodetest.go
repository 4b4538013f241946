// Package nodetest helps the tests of the role nodes: a gossip member that
// stands in for another role (real memberlist on loopback, announcing what
// that role would), a poller for conditions, a GET of /readyz, and a
// random token keyring spec, random authority secrets and a key file
// replaced whole. Only tests import it.
package nodetest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/token"
)

// Quiet is a logger that discards everything.
var Quiet = slog.New(slog.DiscardHandler)

// Member joins a pool (WAN timings when wan) as name with meta, through
// seed unless it is empty; it is closed at the test's end.
func Member(t testing.TB, name string, wan bool, meta membership.Meta, seed string) *membership.Pool {
	t.Helper()
	return ProvenMember(t, name, wan, meta, seed, nil)
}

// ProvenMember is Member with its metadata proven by prove
// (membership.Config.Prove; nil: none).
func ProvenMember(t testing.TB, name string, wan bool, meta membership.Meta, seed string, prove func([]byte) []byte) *membership.Pool {
	t.Helper()
	p, err := membership.New(membership.Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), WAN: wan,
		AllowInsecure: true, Fast: true, Logger: Quiet, Prove: prove}, meta)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if seed != "" {
		if _, err := p.Join([]string{seed}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// Gossip is a node's dev pool config joining seed (none when empty).
func Gossip(name, seed string) node.Gossip {
	g := node.Gossip{Name: name, Bind: "127.0.0.1:0", Insecure: true, Fast: true}
	if seed != "" {
		g.Join = []string{seed}
	}
	return g
}

// Keys is a token keyring spec with one random key.
func Keys(t testing.TB) node.TokenKeys {
	key := make([]byte, token.KeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return node.TokenKeys{Keys: []string{"1:" + base64.StdEncoding.EncodeToString(key)}}
}

// Await polls cond every 10ms until it holds; after 15s the test fails.
func Await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Readyz returns the status code of GET url.
func Readyz(t testing.TB, url string) int {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// Runner is a role node.
type Runner interface {
	Run(ctx context.Context) error
	Close() error
}

// Run runs n until the returned stop (graceful: it cancels Run's context)
// or the test's end (Close), and fails the test if Run fails.
func Run(t testing.TB, n Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	})
	t.Cleanup(func() {
		n.Close()
		stop()
	})
	return stop
}

// HopKeys is an inter-tier key spec with one random key per cluster.
func HopKeys(t testing.TB, clusters ...uint16) node.HopKeys {
	var k node.HopKeys
	for _, c := range clusters {
		key := make([]byte, encap.KeyLen)
		if _, err := rand.Read(key); err != nil {
			t.Fatal(err)
		}
		k.Keys = append(k.Keys, fmt.Sprintf("%d/1:%s", c, base64.StdEncoding.EncodeToString(key)))
	}
	return k
}

// Secret is a random authority secret (authority.KeyLen bytes).
func Secret(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, authority.KeyLen)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// KeyFile is a key file in a test directory and the function that
// replaces its content with specs, one a line: whole, by a rename, as a
// Kubernetes Secret volume swaps its files, so a reader sees the old
// content or the new and never a part.
func KeyFile(t testing.TB) (path string, write func(specs ...string)) {
	path = filepath.Join(t.TempDir(), "keys")
	return path, func(specs ...string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(strings.Join(specs, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}
