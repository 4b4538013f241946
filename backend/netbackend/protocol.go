// Package netbackend carries a session's audio and events between a
// transceiver pod and an inference backend in another process, over one
// TCP connection per session. It is rtcedge's internal backend protocol;
// docs/backend-protocol.md specifies it for backends written in any
// language.
//
// Frames, both ways:
//
//	type (1 byte) | length (3 bytes, big-endian) | payload (length bytes)
//
//	0x01 hello  (pod → backend, first frame): JSON {"session","cluster","pod","config"}
//	0x02 audio  payload = duration in microseconds (4 bytes, big-endian) | one Opus frame
//	0x03 event  payload = one oai-events message (JSON text)
//	0x04 control payload = JSON Control: the reply's items and ends
//	            (backend → pod), barge-ins and the end of the caller's
//	            speech (pod → backend); see docs/backend-protocol.md
//	0x05 server event (pod → backend) payload = one event from the call's
//	     sideband (the app server's own connection, docs/sideband.md): trusted,
//	     never seen by the caller; the backend's answers go out as 0x03 events
//	     to the caller and the sidebands alike
//
// Closing the connection ends the session's backend half. Unknown frame
// types are skipped, so either side can add types later.
package netbackend

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Frame types.
const (
	FrameHello   byte = 0x01
	FrameAudio   byte = 0x02
	FrameEvent   byte = 0x03
	FrameControl byte = 0x04
	// FrameServerEvent carries an event of the call's sideband.
	FrameServerEvent byte = 0x05
)

// Control is the payload of a control frame. Backend → pod: "item" (the
// audio that follows is item ItemID of response ResponseID), "response_done"
// (response ResponseID writes no more audio; the caller gets
// output_audio_buffer.stopped once it has played), "speech_stopped" (the
// backend's own VAD ended the caller's turn), "clear" (the backend's own
// barge-in: the pod drops the queued reply and answers "cleared"),
// "send_dtmf" (a phone call: send Digits to the carrier as DTMF).
// Pod → backend: "cleared" (the reply was cleared by Source: edge, client or
// backend; ItemID was playing and the caller was sent AudioEndMs of it),
// "speech_stopped" (the edge's VAD heard the caller's turn end), "dtmf"
// (a phone call's caller pressed the key Digits, once per press). A backend
// that sends no control frames gets its audio paced with no items, and
// skips the pod's control frames as it skips any unknown type.
type Control struct {
	Type       string `json:"type"`
	ResponseID string `json:"response_id,omitempty"`
	ItemID     string `json:"item_id,omitempty"`
	Source     string `json:"source,omitempty"`
	AudioEndMs int64  `json:"audio_end_ms,omitempty"`
	Digits     string `json:"digits,omitempty"`
}

// Control types.
const (
	ControlItem          = "item"
	ControlResponseDone  = "response_done"
	ControlSpeechStopped = "speech_stopped"
	ControlClear         = "clear"
	ControlCleared       = "cleared"
	// ControlDTMF (pod → backend): a phone call's caller pressed the key
	// in Digits (0–9, *, #, A–D).
	ControlDTMF = "dtmf"
	// ControlSendDTMF (backend → pod): send Digits to the phone call's
	// carrier as DTMF (backend.DTMFSender; refusals are counted by the
	// pod, not answered).
	ControlSendDTMF = "send_dtmf"
)

// MaxPayload bounds one frame: an Opus frame or an event is far smaller;
// anything larger is a broken or hostile peer.
const MaxPayload = 1 << 20

// ErrFrameTooLarge is returned for a frame longer than MaxPayload.
var ErrFrameTooLarge = errors.New("netbackend: frame too large")

// Hello is the first frame of a connection.
type Hello struct {
	Session string `json:"session"`
	Cluster uint16 `json:"cluster"`
	Pod     uint16 `json:"pod"`
	// Config is the session's effective configuration, if any: a JSON
	// object carried as is (for a call placed with a client secret, the
	// app server's config with the client's permitted additions).
	Config json.RawMessage `json:"config,omitempty"`
}

// appendFrame appends one frame to b.
func appendFrame(b []byte, typ byte, parts ...[]byte) ([]byte, error) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > MaxPayload {
		return b, ErrFrameTooLarge
	}
	b = append(b, typ, byte(n>>16), byte(n>>8), byte(n))
	for _, p := range parts {
		b = append(b, p...)
	}
	return b, nil
}

// readFrame reads one frame into buf (grown as needed) and returns its type
// and payload (a subslice of the returned buffer).
func readFrame(r io.Reader, buf []byte) (byte, []byte, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, buf, err
	}
	n := int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3])
	if n > MaxPayload {
		return 0, nil, buf, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, buf, err
	}
	return hdr[0], buf, buf, nil
}

// audioPayload splits an audio frame's payload.
func audioPayload(p []byte) (durationMicros uint32, opus []byte, ok bool) {
	if len(p) < 4 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint32(p), p[4:], true
}
