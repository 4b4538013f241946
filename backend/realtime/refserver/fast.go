package refserver

import (
	"bytes"
	"encoding/base64"
	"strconv"

	"github.com/rtcedge/rtcedge/backend/internal/jsonscan"
)

// The hot events, without encoding/json: a call appends 50 input buffers
// a second and gets its reply as a stream of deltas. What is decoded and
// sent here is exactly what the general path (handle, send) would decode
// and send; anything the fast path is not sure of goes the general way.

const appendType = "input_audio_buffer.append"

// appendEvent is a flat input_audio_buffer.append: subslices of the
// message, valid until the next read.
type appendEvent struct {
	eventID, audio []byte
	hasAudio       bool
}

// scanAppend reads msg as an input_audio_buffer.append if it is a flat JSON
// object of the keys type, event_id and audio (each at most once, exactly
// spelled), with string values of printable ASCII and no escapes (audio
// may also be null), and nothing but white space around it. Anything else
// (another type, nesting, escapes, other keys, invalid JSON) returns false:
// json.Unmarshal decides it.
func scanAppend(msg []byte) (ev appendEvent, ok bool) {
	i := jsonscan.SkipSpace(msg, 0)
	if i >= len(msg) || msg[i] != '{' {
		return ev, false
	}
	i = jsonscan.SkipSpace(msg, i+1)
	var seen [3]bool // type, event_id, audio
	for {
		if i >= len(msg) || msg[i] != '"' {
			return ev, false
		}
		key, j, ok := jsonscan.PlainString(msg, i)
		if !ok {
			return ev, false
		}
		i = jsonscan.SkipSpace(msg, j)
		if i >= len(msg) || msg[i] != ':' {
			return ev, false
		}
		i = jsonscan.SkipSpace(msg, i+1)
		var val []byte
		null := false
		switch {
		case i < len(msg) && msg[i] == '"':
			if val, i, ok = jsonscan.PlainString(msg, i); !ok {
				return ev, false
			}
		case bytes.HasPrefix(msg[i:], []byte("null")):
			null, i = true, i+4
		default:
			return ev, false
		}
		k := -1
		switch string(key) {
		case "type":
			if null || string(val) != appendType {
				return ev, false
			}
			k = 0
		case "event_id":
			if null {
				return ev, false
			}
			k, ev.eventID = 1, val
		case "audio":
			k, ev.audio, ev.hasAudio = 2, val, !null
		}
		if k < 0 || seen[k] {
			return ev, false
		}
		seen[k] = true
		i = jsonscan.SkipSpace(msg, i)
		if i >= len(msg) {
			return ev, false
		}
		if msg[i] == '}' {
			break
		}
		if msg[i] != ',' {
			return ev, false
		}
		i = jsonscan.SkipSpace(msg, i+1)
	}
	return ev, seen[0] && jsonscan.SkipSpace(msg, i+1) == len(msg)
}

// appendID appends an ID as Handler.id makes it ("%s_%06d").
func appendID(b []byte, prefix string, n uint64) []byte {
	b = append(b, prefix...)
	b = append(b, '_')
	for d := uint64(100000); d > 1 && n < d; d /= 10 {
		b = append(b, '0')
	}
	return strconv.AppendUint(b, n, 10)
}

// appendDelta appends an audio delta event as send would marshal its map
// (json.Marshal sorts the keys; no value here needs escaping: the IDs are
// made by Handler.id, the type is a constant and the delta is base64).
func appendDelta(b []byte, typ, responseID, itemID string, eventID, pcm []byte) []byte {
	b = append(b, `{"content_index":0,"delta":"`...)
	n := base64.StdEncoding.EncodedLen(len(pcm))
	b = append(b, make([]byte, n)...)
	base64.StdEncoding.Encode(b[len(b)-n:], pcm)
	b = append(b, `","event_id":"`...)
	b = append(b, eventID...)
	b = append(b, `","item_id":"`...)
	b = append(b, itemID...)
	b = append(b, `","output_index":0,"response_id":"`...)
	b = append(b, responseID...)
	b = append(b, `","type":"`...)
	b = append(b, typ...)
	return append(b, `"}`...)
}
