package netbackend

// The inference side of the protocol: Serve accepts the pods' connections
// and a Conn reads and writes one session's frames.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/rtcedge/rtcedge/backend"
)

// Conn is the backend's side of one session.
type Conn struct {
	Hello Hello
	conn  net.Conn
	wmu   sync.Mutex
	buf   []byte
}

// Read returns the next frame from the pod: FrameAudio (with the frame's
// duration), FrameEvent or FrameControl (ParseControl reads it). The
// payload is only valid until the next Read.
func (c *Conn) Read() (typ byte, payload []byte, d time.Duration, err error) {
	for {
		var p []byte
		typ, p, c.buf, err = readFrame(c.conn, c.buf)
		if err != nil {
			return 0, nil, 0, err
		}
		switch typ {
		case FrameAudio:
			us, opus, ok := audioPayload(p)
			if !ok {
				continue
			}
			return typ, opus, time.Duration(us) * time.Microsecond, nil
		case FrameEvent, FrameControl:
			return typ, p, 0, nil
		}
		// Unknown types are skipped.
	}
}

// WriteAudio sends one Opus frame toward the caller.
func (c *Conn) WriteAudio(opus []byte, d time.Duration) error {
	var dur [4]byte
	binary.BigEndian.PutUint32(dur[:], uint32(d/time.Microsecond))
	return c.write(FrameAudio, dur[:], opus)
}

// WriteControl sends a control frame to the pod: ControlItem before an
// item's audio, ControlResponseDone after a response's last audio, and so
// on (Control).
func (c *Conn) WriteControl(ctl Control) error {
	b, err := json.Marshal(ctl)
	if err != nil {
		return fmt.Errorf("netbackend: control: %w", err)
	}
	return c.write(FrameControl, b)
}

// ParseControl decodes a control frame's payload.
func ParseControl(p []byte) (Control, error) {
	var c Control
	if err := json.Unmarshal(p, &c); err != nil {
		return c, fmt.Errorf("netbackend: control frame: %w", err)
	}
	return c, nil
}

// WriteEvent sends one oai-events message toward the caller.
func (c *Conn) WriteEvent(data []byte) error { return c.write(FrameEvent, data) }

func (c *Conn) write(typ byte, parts ...[]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	frame, err := appendFrame(nil, typ, parts...)
	if err != nil {
		return err
	}
	_, err = c.conn.Write(frame)
	return err
}

// Serve accepts pod connections on ln and runs handle for each session in
// its own goroutine until ctx ends; it closes ln and waits for the
// sessions' handlers (whose connections it closes) before returning.
func Serve(ctx context.Context, ln net.Listener, log *slog.Logger, handle func(context.Context, *Conn)) error {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	var err error
	backoff := 5 * time.Millisecond
	for {
		var c net.Conn
		c, err = ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				break
			}
			// Out of file descriptors and the like: wait, do not stop
			// serving every pod.
			log.Warn("backend accept", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		mu.Lock()
		if ctx.Err() != nil {
			// Accepted while shutting down, after the connections were
			// closed: close this one too.
			mu.Unlock()
			c.Close()
			break
		}
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
			bc, err := accept(c)
			if err != nil {
				log.Debug("backend session refused", "remote", c.RemoteAddr(), "err", err)
				return
			}
			handle(ctx, bc)
		}()
	}
	cancel()
	wg.Wait()
	if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// accept reads the hello frame.
func accept(c net.Conn) (*Conn, error) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	typ, p, buf, err := readFrame(c, nil)
	if err != nil {
		return nil, err
	}
	if typ != FrameHello {
		return nil, fmt.Errorf("first frame has type %#x, want hello", typ)
	}
	var h Hello
	if err := json.Unmarshal(p, &h); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	return &Conn{Hello: h, conn: c, buf: buf}, nil
}

// EchoHandler is the reference backend over the network: audio comes back
// unchanged, a phone call's DTMF digits too (a send_dtmf control frame for
// each dtmf one), every event is answered with an event quoting it (the same
// reply as the in-process echo backend) and, when the session has one, the
// session config the hello carried, so a caller can see what the backend
// was told.
func EchoHandler(_ context.Context, c *Conn) {
	for {
		typ, p, d, err := c.Read()
		if err != nil {
			return
		}
		switch typ {
		case FrameAudio:
			if c.WriteAudio(p, d) != nil {
				return
			}
		case FrameControl:
			if ctl, err := ParseControl(p); err == nil && ctl.Type == ControlDTMF {
				if c.WriteControl(Control{Type: ControlSendDTMF, Digits: ctl.Digits}) != nil {
					return
				}
			}
		case FrameEvent:
			reply := map[string]any{"type": backend.EventEcho, "session": c.Hello.Session}
			if len(c.Hello.Config) > 0 && json.Valid(c.Hello.Config) {
				reply["config"] = c.Hello.Config
			}
			if json.Valid(p) {
				reply["echo"] = json.RawMessage(p)
			} else {
				reply["text"] = string(p)
			}
			b, _ := json.Marshal(reply)
			if c.WriteEvent(b) != nil {
				return
			}
		}
	}
}
