package readbuf

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadWhole: a message arrives whole however the reader splits it,
// and the memory is reused from one message to the next.
func TestReadWhole(t *testing.T) {
	var rb Buffer
	for _, size := range []int{0, 1, 4 << 10, 5 << 10, Keep, Keep + 1, 300 << 10} {
		msg := bytes.Repeat([]byte{'x'}, size)
		got, err := rb.Read(iotest.OneByteReader(bytes.NewReader(msg)), 1<<20)
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("size %d: got %d bytes, err %v", size, len(got), err)
		}
		rb.Release()
	}
	if _, err := rb.Read(strings.NewReader("small"), 1<<20); err != nil {
		t.Fatal(err)
	}
	c := rb.Cap()
	if _, err := rb.Read(strings.NewReader("other"), 1<<20); err != nil || rb.Cap() != c {
		t.Fatalf("cap %d after a second small message, want %d kept (err %v)", rb.Cap(), c, err)
	}
}

// TestGrowthBounded: a message near the limit costs a buffer near the
// limit, not a quarter over it (the growth steps to limit+1 at the end),
// and a buffer that grew over Keep is released after its message.
func TestGrowthBounded(t *testing.T) {
	const limit = 1 << 20
	var rb Buffer
	msg := bytes.Repeat([]byte{'x'}, limit-100)
	if _, err := rb.Read(bytes.NewReader(msg), limit); err != nil {
		t.Fatal(err)
	}
	if c := rb.Cap(); c > limit+1+8<<10 { // slices.Grow rounds up to whole pages
		t.Errorf("buffer of %d bytes for a %d-byte message, limit %d", c, len(msg), limit)
	}
	rb.Release()
	if rb.Cap() != 0 {
		t.Errorf("buffer of %d bytes kept after an outsized message", rb.Cap())
	}
}

// TestReadError: the reader's own error comes back, not a message.
func TestReadError(t *testing.T) {
	var rb Buffer
	boom := errors.New("boom")
	got, err := rb.Read(io.MultiReader(strings.NewReader("part"), iotest.ErrReader(boom)), 1<<20)
	if !errors.Is(err, boom) || got != nil {
		t.Fatalf("got %q, %v; want nil, %v", got, err, boom)
	}
}
