package refserver_test

import (
	"context"
	"encoding/base64"
	"net"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/internal/heaptest"
)

// TestAppendFlood: clients append over a minute of audio each (1 MiB
// appends) to a server with the defaults `rtcedge realtime-ref` runs with.
// While they are connected each holds at most 2 MiB more than a quiet
// session (its input buffer keeps the newest 30 s; an append's read buffer
// is released after it); once they close, the server forgets them.
func TestAppendFlood(t *testing.T) {
	const calls, appends = 3, 3
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := refserver.New(refserver.Config{}, ln)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(context.Background()) }()
	defer func() {
		_ = srv.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	open := func() (*websocket.Conn, *refserver.Session) {
		conn, _, err := websocket.Dial(ctx, srv.URL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() { // the client reads and forgets the server's events
			for {
				if _, _, err := conn.Read(context.Background()); err != nil {
					return
				}
			}
		}()
		s, err := srv.NextSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return conn, s
	}
	base := heaptest.Live()
	var conns []*websocket.Conn
	for range calls {
		c, _ := open()
		conns = append(conns, c)
	}
	quiet := heaptest.Live()
	pcm := make([]byte, 786432) // 16.4 s of silence at 24 kHz
	msg := []byte(`{"type":"input_audio_buffer.append","audio":"` + base64.StdEncoding.EncodeToString(pcm) + `"}`)
	var flooded []*websocket.Conn
	var sessions []*refserver.Session
	for range calls {
		c, s := open()
		// No server VAD: the buffer only grows (and -race runs the VAD
		// slowly), as for a client that commits by itself and never does.
		noVAD := []byte(`{"type":"session.update","session":{"type":"realtime","audio":{"input":{"turn_detection":null}}}}`)
		if err := c.Write(ctx, websocket.MessageText, noVAD); err != nil {
			t.Fatal(err)
		}
		for range appends {
			if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
				t.Fatal(err)
			}
		}
		flooded, sessions = append(flooded, c), append(sessions, s)
	}
	for _, s := range sessions {
		if err := s.Wait(ctx, func(st *refserver.State) bool { return st.InputSamples == appends*int64(len(pcm)/2) }); err != nil {
			t.Fatal(err)
		}
	}
	full := heaptest.Live()
	perQuiet, perFlood := (quiet-base)/calls, (full-quiet)/calls
	t.Logf("a quiet session holds %d KiB, a flooded one %d KiB", perQuiet>>10, perFlood>>10)
	if perFlood-perQuiet > 2<<20 {
		t.Errorf("a flooded session holds %d KiB more than a quiet one, want ≤ 2048 KiB", (perFlood-perQuiet)>>10)
	}
	for _, s := range sessions {
		_ = s.Wait(ctx, func(st *refserver.State) bool {
			if st.InputDropped == 0 {
				t.Errorf("no input dropped after %d samples", st.InputSamples)
			}
			return true
		})
	}
	for _, c := range flooded {
		_ = c.Close(websocket.StatusNormalClosure, "")
	}
	for _, s := range sessions {
		if err := s.Wait(ctx, func(st *refserver.State) bool { return st.Closed }); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(srv.Sessions()); n != calls {
		t.Errorf("%d sessions listed, want the %d open ones", n, calls)
	}
	after := heaptest.Live()
	t.Logf("after the flooded sessions closed the server holds %d KiB more than before them", (after-quiet)>>10)
	if after-quiet > calls*64<<10 {
		t.Errorf("closed sessions still hold %d KiB", (after-quiet)>>10)
	}
	for _, c := range conns {
		_ = c.Close(websocket.StatusNormalClosure, "")
	}
}
