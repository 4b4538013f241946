package oaievents

// The strict reading every event takes before the pod acts on it: one
// JSON object, nothing before or after it, and nothing two parsers could
// read differently. Go's encoding/json matches member names without
// regard to case and keeps the last of two equal ones; Python's and
// JavaScript's keep the last exact one and never fold case; some read a
// byte-order mark or NaN where others refuse. An event that any of them
// could read otherwise than the pod is refused, and what goes on is
// re-encoded from what the pod read (jsontext writes every string and
// number afresh), never the sender's bytes.

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

const (
	// maxDepth bounds nesting: a session's tool schemas nest a few levels;
	// a caller's events two or three.
	maxDepth = 32
	// maxMembers bounds the members of one object, so that the duplicate
	// check (a linear scan of hashes) stays cheap whatever an event holds.
	maxMembers = 256
	// keepBuffer is the largest output buffer a walker keeps between
	// events: a rare big event does not pin its size for good.
	keepBuffer = 64 << 10
)

// bom is UTF-8's byte-order mark, which some parsers skip and others
// refuse.
var bom = []byte("\xef\xbb\xbf")

// checked is what Check read of an event's top level.
type checked struct {
	typ, eventID []byte // alias the walker's scratch; valid until its next use
	hasType      bool   // a "type" member that is a string
}

// walker is the reusable state of one event's reading and writing; a
// pool holds them, so a call keeps none between events.
type walker struct {
	in      bytes.Buffer // aliases the event while one is read
	dec     jsontext.Decoder
	subIn   bytes.Buffer // aliases one member's value (a session field)
	sub     jsontext.Decoder
	out     bytes.Buffer
	enc     jsontext.Encoder
	seen    [][]uint64 // folded member name hashes, per open object
	scratch []byte     // the top-level type and event_id
	fold    []byte
	path    []seg    // the members and indexes from the event down to the value in hand
	refused []string // the paths of the refused members and values
	caller  *Caller  // the call whose session.update is read
	// emitting: the value in hand is written to out (false once anything
	// was refused, and during a session field's dry run).
	emitting bool
}

var walkers = sync.Pool{New: func() any { return new(walker) }}

func getWalker() *walker { return walkers.Get().(*walker) }

func putWalker(w *walker) {
	w.in, w.subIn = bytes.Buffer{}, bytes.Buffer{} // the event is the caller's: keep no reference
	w.dec.Reset(&w.in)
	w.sub.Reset(&w.subIn)
	if w.out.Cap() > keepBuffer {
		w.out = bytes.Buffer{}
	}
	w.enc.Reset(&w.out)
	if cap(w.scratch) > keepBuffer {
		w.scratch = nil
	}
	w.path, w.refused, w.caller = w.path[:0], w.refused[:0], nil
	walkers.Put(w)
}

// start points the decoder at data.
func (w *walker) start(data []byte) {
	w.in = *bytes.NewBuffer(data)
	w.dec.Reset(&w.in)
}

// Check reads data strictly (see the file comment) and returns nil if it
// is one JSON object that every parser reads alike. The error wraps
// ErrMalformed and says what is wrong.
func Check(data []byte) error {
	w := getWalker()
	defer putWalker(w)
	_, err := w.check(data)
	return err
}

// check is Check, also returning the top-level type and event_id.
func (w *walker) check(data []byte) (checked, error) {
	var c checked
	if bytes.HasPrefix(data, bom) {
		return c, fmt.Errorf("%w: a byte-order mark before the value", ErrMalformed)
	}
	w.start(data)
	w.scratch = w.scratch[:0]
	if w.dec.PeekKind() != '{' {
		if _, err := w.dec.ReadToken(); err != nil {
			return c, malformed(err)
		}
		return c, fmt.Errorf("%w: not a JSON object", ErrMalformed)
	}
	if err := w.checkValue(&c); err != nil {
		return c, err
	}
	if _, err := w.dec.ReadToken(); err != io.EOF {
		return c, fmt.Errorf("%w: data after the object", ErrMalformed)
	}
	return c, nil
}

func malformed(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %v", ErrMalformed, err)
}

// checkValue reads one value; top (non-nil for the event's own object)
// receives its type and event_id.
func (w *walker) checkValue(top *checked) error {
	tok, err := w.dec.ReadToken()
	if err != nil {
		return malformed(err)
	}
	switch tok.Kind() {
	case '0':
		// Valid JSON, but some parsers read 1e400 as infinity and others
		// refuse it: only finite doubles pass.
		if _, err := strconv.ParseFloat(tok.String(), 64); err != nil {
			return fmt.Errorf("%w: number %s is out of range", ErrMalformed, tok.String())
		}
	case '[':
		if w.dec.StackDepth() > maxDepth {
			return fmt.Errorf("%w: nested deeper than %d", ErrMalformed, maxDepth)
		}
		for w.dec.PeekKind() != ']' {
			if err := w.checkValue(nil); err != nil {
				return err
			}
		}
		if _, err := w.dec.ReadToken(); err != nil {
			return malformed(err)
		}
	case '{':
		return w.checkObject(top)
	}
	return nil
}

func (w *walker) checkObject(top *checked) error {
	depth := w.dec.StackDepth()
	if depth > maxDepth {
		return fmt.Errorf("%w: nested deeper than %d", ErrMalformed, maxDepth)
	}
	for len(w.seen) < depth {
		w.seen = append(w.seen, nil)
	}
	seen := w.seen[depth-1][:0]
	for w.dec.PeekKind() != '}' {
		name, err := w.dec.ReadToken()
		if err != nil {
			return malformed(err)
		}
		if len(seen) == maxMembers {
			return fmt.Errorf("%w: an object with over %d members", ErrMalformed, maxMembers)
		}
		h := w.foldHash(name.String())
		for _, s := range seen {
			if s == h {
				return fmt.Errorf("%w: member %q appears twice (names are compared without regard to case)", ErrMalformed, name.String())
			}
		}
		seen = append(seen, h)
		w.seen[depth-1] = seen
		if top != nil {
			switch name.String() {
			case "type":
				if w.dec.PeekKind() == '"' {
					v, err := w.dec.ReadToken()
					if err != nil {
						return malformed(err)
					}
					top.hasType = true
					w.scratch = append(w.scratch, v.String()...)
					top.typ = w.scratch[len(w.scratch)-len(v.String()):]
					continue
				}
			case "event_id":
				if w.dec.PeekKind() == '"' {
					v, err := w.dec.ReadToken()
					if err != nil {
						return malformed(err)
					}
					w.scratch = append(w.scratch, v.String()...)
					top.eventID = w.scratch[len(w.scratch)-len(v.String()):]
					continue
				}
			}
		}
		if err := w.checkValue(nil); err != nil {
			return err
		}
	}
	if _, err := w.dec.ReadToken(); err != nil {
		return malformed(err)
	}
	return nil
}

// foldHash hashes a member name folded as Go's encoding/json matches
// names (simple Unicode case folding: "TYPE", "Type" and "type" fold
// alike, and so do "K" and the Kelvin sign).
func (w *walker) foldHash(name string) uint64 {
	w.fold = w.fold[:0]
	for _, r := range name {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			w.fold = append(w.fold, byte(r))
			continue
		}
		w.fold = utf8.AppendRune(w.fold, unicode.ToUpper(unicode.ToLower(r)))
	}
	// FNV-1a, inline: hash/fnv's hasher would cost an allocation per name.
	h := uint64(14695981039346656037)
	for _, b := range w.fold {
		h ^= uint64(b)
		h *= 1099511628211
	}
	return h
}

// copyValue re-encodes the next value from the decoder to the encoder,
// token by token: strings and numbers are written afresh by jsontext.
// The value was checked.
func (w *walker) copyValue(d *jsontext.Decoder) error {
	depth := 0
	for {
		tok, err := d.ReadToken()
		if err != nil {
			return malformed(err)
		}
		if err := w.enc.WriteToken(tok); err != nil {
			return fmt.Errorf("re-encode: %w", err)
		}
		switch tok.Kind() {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// begin points the decoder at data and the encoder at an empty output.
func (w *walker) begin(data []byte) {
	w.start(data)
	w.out.Reset()
	w.enc.Reset(&w.out)
	w.emitting = true
}

// result copies the encoder's output (without the newline jsontext ends
// a top-level value with) out of the walker.
func (w *walker) result() []byte {
	return bytes.Clone(bytes.TrimSuffix(w.out.Bytes(), []byte("\n")))
}

// Canonical reads an event strictly (Check) and returns it re-encoded
// from what was read, with its type: for the sideband's events, which are
// trusted in what they say but must say it unambiguously. An event without
// a string "type" is refused (ErrMalformed).
func Canonical(data []byte) (ev []byte, typ string, err error) {
	w := getWalker()
	defer putWalker(w)
	c, err := w.check(data)
	if err != nil {
		return nil, "", err
	}
	if !c.hasType {
		return nil, "", fmt.Errorf("%w: no \"type\" string", ErrMalformed)
	}
	typ = string(c.typ)
	w.begin(data)
	if err := w.copyValue(&w.dec); err != nil {
		return nil, "", err
	}
	return w.result(), typ, nil
}
