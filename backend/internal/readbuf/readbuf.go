// Package readbuf reads whole WebSocket messages into one buffer a
// connection reuses from message to message: the connector's reader of a
// model server's events (backend/realtime) and the reference server's
// reader of a call's events (backend/realtime/refserver) both hold one.
//
// The buffer doubles up to Keep, then grows four times over, and to the
// message limit at once when that is within reach: growing by append would
// end up to a quarter over a large message, and its last step would hold
// the old buffer and the new one, both near the limit, at once. A buffer
// that grew over Keep is released after its message, so a rare large
// message does not pin its size for the life of the connection.
package readbuf

import (
	"errors"
	"io"
	"slices"
)

// Keep is the largest buffer kept from one message to the next. Events of
// a turn are a few KiB; a session's echo tens.
const Keep = 64 << 10

// Buffer is one connection's read buffer; owned by its reader, not safe
// for concurrent use. The zero value is ready.
type Buffer struct {
	b []byte
}

// Read reads r to its end (io.EOF) into the buffer and returns the message,
// valid until the next Read or Release. limit is the largest message r
// delivers (the WebSocket's read limit, which reads one byte past it before
// failing): the buffer never grows past limit+1 for it. An error other than
// io.EOF is returned as r gave it.
func (rb *Buffer) Read(r io.Reader, limit int) ([]byte, error) {
	rb.b = rb.b[:0]
	for {
		if len(rb.b) == cap(rb.b) {
			rb.b = grow(rb.b, limit)
		}
		n, err := r.Read(rb.b[len(rb.b):cap(rb.b)])
		rb.b = rb.b[:len(rb.b)+n]
		if errors.Is(err, io.EOF) {
			return rb.b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// Release drops the buffer if it grew over Keep: an outsized message's
// buffer is not the connection's to keep.
func (rb *Buffer) Release() {
	if cap(rb.b) > Keep {
		rb.b = nil
	}
}

// Drop drops the buffer whatever its size (a closed connection's).
func (rb *Buffer) Drop() { rb.b = nil }

// Cap is the buffer's capacity: the memory it holds.
func (rb *Buffer) Cap() int { return cap(rb.b) }

// grow makes room in a full buffer (see the package comment).
func grow(b []byte, limit int) []byte {
	n := max(2*cap(b), 4<<10)
	if n > Keep {
		n = 4 * cap(b)
		if 2*n > limit {
			n = max(limit+1, cap(b)+1)
		}
	}
	return slices.Grow(b, n-len(b))
}
