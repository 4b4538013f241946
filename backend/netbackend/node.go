package netbackend

// The inference backend as a node: its lifecycle and readiness, and the
// Backend a pod reaches it by.

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/echo"
	"github.com/rtcedge/rtcedge/internal/node"
)

// ForAddr is the backend a transceiver node with backend_addr addr uses:
// the network backend at addr, or the in-process echo backend when addr
// is empty.
func ForAddr(addr string, log *slog.Logger) backend.Backend {
	if addr == "" {
		return echo.Backend{}
	}
	return &Backend{Addr: addr, Logger: log}
}

// Ready reports whether the backend accepts connections (a TCP connect
// within ctx), so a transceiver's readiness can include its backend.
func (b *Backend) Ready(ctx context.Context) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", b.Addr)
	if err != nil {
		return fmt.Errorf("dial backend %s: %w", b.Addr, err)
	}
	return c.Close()
}

// Node is the reference echo backend as a process runs it.
type Node struct {
	cfg  NodeConfig
	env  node.Env
	life node.Life
	ln   net.Listener
}

// NewNode builds the backend node on ln (nil: opened on cfg.Listen) with
// an optional metrics listener for /livez and /readyz.
func NewNode(cfg NodeConfig, ln, metrics net.Listener, env node.Env) (_ *Node, err error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env = env.WithDefaults()
	n := &Node{cfg: cfg, env: env}
	defer func() {
		if err != nil {
			n.life.Close()
		}
	}()
	if ln == nil {
		if ln, err = node.Listen("listen", cfg.Listen); err != nil {
			return nil, err
		}
	}
	n.ln = ln
	n.life.OnClose(ln.Close)
	n.life.Go("serve", func(ctx context.Context) error { return Serve(ctx, ln, env.Logger, EchoHandler) })
	if metrics == nil {
		if metrics, err = node.Listen("metrics_addr", cfg.MetricsAddr); err != nil {
			return nil, err
		}
	}
	n.life.ServeHealth(metrics, env, n.Ready)
	return n, nil
}

// Run serves until ctx ends; open sessions are closed then.
func (n *Node) Run(ctx context.Context) error {
	n.env.Logger.Info("echo backend up", "addr", n.ln.Addr().String())
	return n.life.Run(ctx, n.env.Logger, nil)
}

// Close stops the node at once.
func (n *Node) Close() error { return n.life.Close() }

// Ready reports whether the backend serves.
func (n *Node) Ready() error {
	if n.life.Closed() {
		return node.ErrClosed
	}
	return nil
}

// Addr is the backend's listen address.
func (n *Node) Addr() string { return n.ln.Addr().String() }
