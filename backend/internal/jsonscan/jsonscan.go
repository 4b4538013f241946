// Package jsonscan reads the top level of a flat JSON object in place,
// without allocating: the connector reads every server event's type and
// audio delta with it (backend/realtime, dozens of deltas a second per
// call), and the reference server its clients' input_audio_buffer.append
// (backend/realtime/refserver, 50 a second per call).
//
// It is a scanner, not a validator: it finds where strings and values
// end, and its users hand anything it is unsure of to encoding/json. The
// strict reading of a caller's events (backend/oaievents) is another job:
// it refuses what two parsers could read differently and re-encodes what
// it keeps, at the cost of a full tokenizer; these events come from the
// model server or go to the reference server, and are read for routing
// only.
package jsonscan

// SkipSpace returns the index of the first byte at or after i that is not
// JSON white space (len(b) if none).
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// String scans the string that starts at b[i] (a '"'): it returns the
// index after its closing quote (-1 if it has none) and whether it holds
// a backslash escape (its contents then need decoding).
func String(b []byte, i int) (end int, escaped bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, escaped
}

// PlainString scans the string that starts at b[i] (a '"') if it is plain:
// printable ASCII with no backslash, so that its bytes are its value. It
// returns the contents and the index after the closing quote; ok is false
// for any other string.
func PlainString(b []byte, i int) (s []byte, next int, ok bool) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// SkipValue returns the index after the value that starts at b[i] (a
// string, an object or array with whatever they nest, or a literal up to
// the next delimiter), or -1 if a string or a nesting is left open. A
// literal's spelling is not checked.
func SkipValue(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch c := b[i]; c {
		case '"':
			end, _ := String(b, i)
			if end < 0 {
				return -1
			}
			i = end
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	if depth == 0 {
		return i
	}
	return -1
}
