package sessionapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// TestRelay: a front relays a sideband to an upstream behind a secret:
// messages both ways in order; the upstream's close status and reason
// reach the client; a refusal comes back as the upstream's status; and
// closing the relay set ends a live relay as going away.
func TestRelay(t *testing.T) {
	const secret = "hop-secret"
	closeWith := make(chan websocket.StatusCode, 1)
	upstream := httptest.NewServer(sessionapi.RequireSecret(secret, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := sessionapi.AcceptSideband(w, r)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		ctx := context.Background()
		for i := 0; ; i++ {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if string(data) == "close" {
				_ = conn.Close(<-closeWith, "upstream says so")
				return
			}
			_ = conn.Write(ctx, typ, append(data, '!'))
		}
	})))
	defer upstream.Close()
	relays := sessionapi.NewRelays()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up, status, _, err := sessionapi.DialSideband(r.Context(), upstream.Client(), upstream.URL+r.URL.Path, r.Header.Get("X-Secret"))
		if err != nil {
			w.WriteHeader(status)
			return
		}
		down, err := sessionapi.AcceptSideband(w, r)
		if err != nil {
			_ = up.CloseNow()
			return
		}
		relays.Relay(down, up)
	}))
	defer front.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(hopSecret string) (*websocket.Conn, int) {
		conn, resp, err := websocket.Dial(ctx, front.URL+sessionapi.SidebandPath("rtc_x"), &websocket.DialOptions{HTTPHeader: http.Header{"X-Secret": {hopSecret}}})
		if err != nil {
			return nil, resp.StatusCode
		}
		return conn, http.StatusSwitchingProtocols
	}
	if _, st := dial("wrong"); st != http.StatusUnauthorized {
		t.Fatalf("upstream refusal: %d, want its 401", st)
	}

	conn, _ := dial(secret)
	defer conn.CloseNow()
	for _, m := range []string{"a", "b", "c"} {
		if err := conn.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"a!", "b!", "c!"} {
		if _, got, err := conn.Read(ctx); err != nil || string(got) != want {
			t.Fatalf("read %q %v, want %q", got, err, want)
		}
	}
	closeWith <- sessionapi.CloseSlow
	_ = conn.Write(ctx, websocket.MessageText, []byte("close"))
	_, _, err := conn.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != sessionapi.CloseSlow || ce.Reason != "upstream says so" {
		t.Fatalf("close passed on as %v, want %d and the reason", err, sessionapi.CloseSlow)
	}

	live, _ := dial(secret)
	defer live.CloseNow()
	read := make(chan error, 1)
	go func() { _, _, err := live.Read(ctx); read <- err }()
	relays.Close()
	if err := <-read; websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("after Close: %v, want going away", err)
	}
}
