package sessionapi

// The sideband of a session (docs/sideband.md): an app server's WebSocket
// that sees the call's server events and sends events of its own to the
// backend. Signaling authenticates the app server, then each hop dials the
// next with its session API secret and relays messages:
//
//	GET SessionsPath/{id}/sideband   WebSocket upgrade -> 101, 401, 404 apierr body
//
// on the cluster's front (forwarded to the pod the ID names) and on the pod
// (which attaches the WebSocket to the session).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// SidebandPath is the sideband WebSocket of session id on a session API.
func SidebandPath(id string) string { return SessionsPath + "/" + id + "/sideband" }

// MaxSidebandMessage bounds one message on every hop of a sideband: an
// event with a session's tools and instructions, or a tool's output.
const MaxSidebandMessage = 1 << 20

// Close codes a sideband ends with, besides the standard ones.
const (
	// CloseSlow: the sideband did not read the call's events fast enough
	// and its bounded queue filled; the call went on without it.
	CloseSlow websocket.StatusCode = 4008
	// CloseCallEnded: the call ended.
	CloseCallEnded websocket.StatusCode = 4000
)

// DialSideband opens the sideband WebSocket at url (a SidebandPath on a
// session API) with the hop's bearer secret. When the hop answers without
// upgrading, it returns its status and at most 64 KiB of its body (status 0:
// no answer; err says why).
func DialSideband(ctx context.Context, client *http.Client, url, secret string) (*websocket.Conn, int, []byte, error) {
	hdr := http.Header{}
	if secret != "" {
		hdr.Set("Authorization", "Bearer "+secret)
	}
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: client, HTTPHeader: hdr})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var body []byte
			if resp.Body != nil {
				body, _ = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
				resp.Body.Close()
			}
			return nil, resp.StatusCode, body, fmt.Errorf("sideband refused: HTTP %d", resp.StatusCode)
		}
		return nil, 0, nil, fmt.Errorf("dial sideband: %w", err)
	}
	conn.SetReadLimit(MaxSidebandMessage)
	return conn, http.StatusSwitchingProtocols, nil, nil
}

// AcceptSideband upgrades a sideband request. Origins are not checked: a
// sideband is for servers holding an API key (or, on the internal hops, the
// session API secret), never for a browser's ambient credentials.
func AcceptSideband(w http.ResponseWriter, r *http.Request) (*websocket.Conn, error) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, Subprotocols: []string{"realtime"}})
	if err != nil {
		return nil, fmt.Errorf("accept sideband: %w", err)
	}
	conn.SetReadLimit(MaxSidebandMessage)
	return conn, nil
}

// Relays runs a front's sideband relays and ends them when it closes (a
// relay outlives the HTTP server that accepted it: its connection was
// hijacked). The zero value is not usable; use NewRelays.
type Relays struct {
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool // guarded by mu: no relay starts after Close
	wg     sync.WaitGroup
}

// NewRelays returns a relay set that runs until Close.
func NewRelays() *Relays {
	ctx, cancel := context.WithCancel(context.Background())
	return &Relays{ctx: ctx, cancel: cancel}
}

// Relay copies messages both ways between down (the accepted side) and up
// (the dialed side), one message at a time and in order, until either side
// closes or the set closes. The close status and reason of the side that
// closed are passed on to the other (a pod's "slow" or "call ended" reaches
// the app server). Both connections are closed when it returns.
func (rs *Relays) Relay(down, up *websocket.Conn) {
	rs.mu.Lock()
	if rs.closed {
		rs.mu.Unlock()
		_ = down.Close(websocket.StatusGoingAway, "the front is shutting down")
		_ = up.CloseNow()
		return
	}
	rs.wg.Add(1)
	rs.mu.Unlock()
	defer rs.wg.Done()
	closeBoth := func(code websocket.StatusCode, reason string) {
		// The side that closed first returns at once; the pumps end with
		// the handshakes.
		var closing sync.WaitGroup
		for _, c := range []*websocket.Conn{down, up} {
			closing.Go(func() { CloseWithin(c, code, reason, CloseWait) })
		}
		closing.Wait()
	}
	// Not rs.ctx: a cancelled read closes its connection without a
	// status. The set's Close closes both ends as going away instead.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(rs.ctx, func() { closeBoth(websocket.StatusGoingAway, "the front is shutting down") })
	ended := make(chan error, 2)
	go func() { ended <- pump(ctx, up, down) }()
	go func() { ended <- pump(ctx, down, up) }()
	first := <-ended
	code, reason := websocket.StatusGoingAway, "the other side of the sideband went away"
	var ce websocket.CloseError
	if errors.As(first, &ce) && ce.Code != websocket.StatusNoStatusRcvd && ce.Code != websocket.StatusAbnormalClosure && ce.Code != websocket.StatusTLSHandshake {
		code, reason = ce.Code, ce.Reason
	}
	if !stop() {
		<-rs.ctx.Done() // the set's Close is closing both
		code, reason = websocket.StatusGoingAway, "the front is shutting down"
	}
	closeBoth(code, reason)
	cancel()
	<-ended
	_ = down.CloseNow()
	_ = up.CloseNow()
}

// pump copies messages from one connection to the other until an error.
func pump(ctx context.Context, from, to *websocket.Conn) error {
	for {
		typ, rd, err := from.Reader(ctx)
		if err != nil {
			return err
		}
		wr, err := to.Writer(ctx, typ)
		if err != nil {
			return err
		}
		if _, err := io.Copy(wr, rd); err != nil {
			_ = wr.Close()
			return err
		}
		if err := wr.Close(); err != nil {
			return err
		}
	}
}

// CloseWait bounds a sideband's close handshake on every hop: a peer that
// does not read gets its connection cut after it.
const CloseWait = time.Second

// CloseWithin closes conn with a close handshake bounded by d, then at
// once.
func CloseWithin(conn *websocket.Conn, code websocket.StatusCode, reason string, d time.Duration) {
	done := make(chan struct{})
	go func() {
		_ = conn.Close(code, reason)
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = conn.CloseNow()
		<-done
	}
}

// Close ends every relay (closing both sides as going away) and waits for
// them.
func (rs *Relays) Close() {
	rs.mu.Lock()
	rs.closed = true
	rs.mu.Unlock()
	rs.cancel()
	rs.wg.Wait()
}
