// Package backend is the inference side of a call, seen from the pod: the
// interface the transceiver bridges every session to, and the backends that
// implement it (echo, rtcedge's network protocol in netbackend). A new model
// backend is a package here; it never touches the pod.
package backend

import (
	"context"
	"errors"
	"time"
)

// The names of what the edge itself says, written once.
const (
	// EventIDPrefix starts the event_id of every event the edge makes
	// itself (the pod's output_audio_buffer events and refusals, a
	// connector's cancel and truncate): the IDs cannot collide with a
	// caller's, and a model server's error about one is the edge's
	// business, not the caller's.
	EventIDPrefix = "event_rtcedge_"
	// EventTurn is the pod's event of a turn's timing (reply delay,
	// barge-in), sent to the caller and the sidebands.
	EventTurn = "rtcedge.turn"
	// EventEcho is the echo backends' answer to a data-channel event.
	EventEcho = "rtcedge.echo"
	// EventDTMFReceived is the event of a keypad digit the caller of a
	// phone call pressed: OpenAI's server event for SIP calls, {"type",
	// "event_id", "event": "5", "received_at": Unix seconds}, sent to the
	// call's event consumers (the sidebands), never to a model server.
	EventDTMFReceived = "input_audio_buffer.dtmf_event_received"
	// EventDTMFSend is rtcedge's event by which an app server's sideband
	// asks a phone call's pod to send keypad digits to the carrier:
	// {"type": "rtcedge.dtmf.send", "digits": "1234#"} (docs/sip.md).
	EventDTMFSend = "rtcedge.dtmf.send"
)

// Backend is the inference side of a session: it hears the caller's audio
// and data-channel events and talks back. Implementations must be safe for
// concurrent use; Open is called once per session.
type Backend interface {
	// Open starts the backend half of a session before the answer is
	// returned, so a slow or refusing backend fails the request instead of
	// a connected call. out stays valid until Handler.Close returns.
	Open(ctx context.Context, info SessionInfo, out Sink) (Handler, error)
}

// Handler receives one session's input and must not block for long. Audio
// is called on the pod socket's reader that decrypted the frame (the pod's
// media path), one call at a time per session: a handler that
// blocks holds up that reader's other sessions too, so hand slow work to
// a goroutine of your own (netbackend queues every frame). Event is called
// from the session's data-channel reader.
type Handler interface {
	// Audio is one Opus frame from the caller; payload is only valid
	// during the call.
	Audio(payload []byte, duration time.Duration)
	// Event is one message the caller sent on the oai-events data channel;
	// data is only valid during the call. A backend that hands events to
	// a model translates them first (backend/oaievents): the caller's
	// bytes never reach a model server.
	Event(data []byte)
	// Close ends the backend half; called exactly once when the session ends.
	Close() error
}

// Sink is how a backend talks to the caller.
type Sink interface {
	// WriteAudio sends one Opus frame to the caller.
	WriteAudio(payload []byte, duration time.Duration) error
	// SendEvent sends one message on the oai-events data channel. Messages
	// sent before the channel opens (a server's greeting) are held, up to
	// 64 KiB, and sent first when it opens; beyond that, or after it
	// closed, they are dropped with an error.
	SendEvent(data []byte) error
}

// SessionInfo describes a session to its backend.
type SessionInfo struct {
	ID      string
	Cluster uint16
	Pod     uint16
	// Config is the opaque session configuration the client sent (the
	// "session" field of an OpenAI-style call), or nil.
	Config []byte
	// ClientSessionFields are the session fields the caller's own
	// session.update may set (nil: internal/sessionapi's default), and
	// SealedWins drops the others without an error event: the call's
	// policy, from signaling (backend/oaievents).
	ClientSessionFields []string
	SealedWins          bool
	// G711 is the audio format of a phone call that goes to the backend
	// as the carrier sent it: AudioPCMU or AudioPCMA, only for a Backend
	// that TakesG711. Handler.Audio then gets the G.711 payloads of the
	// caller's RTP (8 kHz, a byte a sample) and Sink.WriteAudio takes the
	// reply as G.711 of the same law. "": Opus both ways.
	G711 string
}

// The G.711 formats of SessionInfo.G711, named as OpenAI's Realtime
// sessions name them (audio.input.format.type).
const (
	AudioPCMU = "audio/pcmu"
	AudioPCMA = "audio/pcma"
)

// G711Taker is implemented by a Backend that can take a phone call's
// G.711 without transcoding (the Realtime connector to a server that
// speaks audio/pcmu and audio/pcma): the pod then runs no codec for the
// call (SessionInfo.G711).
type G711Taker interface {
	TakesG711() bool
}

// Ender is implemented by the Sink a session gives its backend: a backend
// whose own side of the session fails (a model server closed the
// connection) ends the call instead of leaving the caller with dead air.
type Ender interface {
	End(reason string)
}

// Ready is implemented by a Backend that can tell whether it can open
// sessions (the network backend dials it); the pod's readiness asks it.
type Ready interface {
	Backend
	Ready(ctx context.Context) error
}

// Player is implemented by the Sink a session gives its backend (the pod's
// paced output, transceiver/pace): the pod sends the audio a backend
// writes at real time, so it is the one that knows what the caller has
// heard. A backend that uses it says which response item its audio belongs
// to and when a response has no more, and it can stop the reply at once.
// The pod sends output_audio_buffer.started, stopped and cleared to the
// caller from these. Backends that never call it keep working: their audio
// is paced as frames of no item, with no events.
type Player interface {
	// BeginItem makes the audio written from now on item itemID of
	// response responseID.
	BeginItem(responseID, itemID string)
	// EndResponse says response responseID will write no more audio.
	EndResponse(responseID string)
	// SpeechStopped says the caller's turn ended (a backend's own VAD):
	// the pod measures the reply delay from it.
	SpeechStopped()
	// Clear drops the queued reply audio now (a barge-in; source is
	// ClearBackend or ClearClient) and reports the item that was playing
	// and how much of it the caller was sent; ok is false when no reply
	// was playing or queued.
	Clear(source string) (itemID string, played time.Duration, ok bool)
}

// StartAwaiter is implemented by the pod's Player: AwaitStart returns once
// the first frame of response responseID has been sent to the caller, or
// none of its audio is queued, waiting at most a few frames. A backend
// that forwards its server's response.done calls it first, so the caller
// sees output_audio_buffer.started before response.done (as OpenAI's
// WebRTC endpoint sends them) even when the whole response arrived faster
// than the pod's next 5 ms slot.
type StartAwaiter interface {
	AwaitStart(responseID string)
}

// InputRater is implemented by a Backend that decodes the caller's audio to
// PCM at a rate below Opus's 48 kHz (the Realtime connector): the pod's
// answer asks the caller's encoder to code no audio above what that rate
// keeps (maxplaybackrate, RFC 7587 section 6.1). A browser then codes
// super-wideband instead of fullband for a 24 kHz backend (wideband, SILK
// only, for 16 kHz), which the backend could not hear anyway and which costs
// the pod's decoder less (docs/codec.md).
type InputRater interface {
	InputRate() int
}

// FrameEncoder encodes one frame a backend wrote raw (RawWriter) into the
// payload the caller is sent, appended to dst. The pod calls it when it
// sends the frame, one frame at a time per session, in the order written,
// possibly after the backend's handler was closed (it then fails).
type FrameEncoder interface {
	EncodeFrame(dst, frame []byte) ([]byte, error)
}

// RawWriter is implemented by the Sink a session gives its backend (the
// pod's paced output): a backend that transcodes writes each frame of its
// reply before encoding, with the encoder that makes it a frame for the
// caller, and the pod encodes it only when it sends it. Audio a barge-in
// clears (Player.Clear) is then never encoded, and the encoder's state
// follows exactly what the caller's decoder was sent.
type RawWriter interface {
	WriteRaw(frame []byte, duration time.Duration, enc FrameEncoder) error
}

// Barge-in sources: what made the pod clear a reply (the source label of
// rtcedge_bargeins_total).
const (
	ClearBackend = "backend" // the backend's VAD heard the caller (speech_started)
	ClearEdge    = "edge"    // the edge's VAD heard the caller (backends without VAD: Interrupter)
	ClearClient  = "client"  // the caller sent output_audio_buffer.clear
)

// Interrupter is implemented by a Handler whose backend has no voice
// activity detection of its own and wants the edge's (netbackend): while a
// reply is playing and the edge hears the caller start speaking, the pod
// clears the reply and tells the handler; the end of the caller's speech
// is reported too.
type Interrupter interface {
	// Interrupted reports a barge-in the pod acted on: the reply's
	// queued audio was dropped; itemID was playing and the caller was
	// sent played of it (empty itemID: no item was playing).
	Interrupted(source, itemID string, played time.Duration)
	// SpeechStopped reports the end of the caller's speech by the edge's
	// detector.
	SpeechStopped()
}

// DTMFHandler is implemented by a Handler that takes the keypad digits
// the caller of a phone call presses (RFC 4733 events from the carrier,
// docs/sip.md): DTMF is called once per digit, '0'–'9', '*', '#' or
// 'A'–'D', on the pod's media path as Audio is, and must not block.
type DTMFHandler interface {
	DTMF(digit byte)
}

// DTMFSender is implemented by the Sink of a phone call: SendDTMF queues
// keypad digits to be sent to the carrier as RFC 4733 events on the
// call's RTP stream, after those already queued, and returns at once. It
// fails with ErrDTMFDigits for a string that is empty or not all digits,
// ErrDTMFQueueFull when more than MaxDTMFQueued would wait, and
// ErrDTMFUnsupported when the carrier's offer had no telephone-event.
type DTMFSender interface {
	SendDTMF(digits string) error
}

// MaxDTMFQueued bounds the digits waiting to be sent on one call.
const MaxDTMFQueued = 64

// Sentinel errors of DTMFSender.SendDTMF.
var (
	// ErrDTMFDigits: not a string of keypad digits (0–9, *, #, A–D).
	ErrDTMFDigits = errors.New("backend: not a string of keypad digits")
	// ErrDTMFQueueFull: more than MaxDTMFQueued digits would wait.
	ErrDTMFQueueFull = errors.New("backend: too many DTMF digits queued")
	// ErrDTMFUnsupported: the carrier did not offer telephone-event.
	ErrDTMFUnsupported = errors.New("backend: the carrier takes no DTMF events")
)

// ServerEvents is implemented by a Handler that takes events from the
// call's sideband (docs/sideband.md): the app server's own connection to
// the call, authenticated at signaling. They are trusted, as the events
// of the app that placed the call: none of the caller's filters apply,
// and none of them reaches the caller. ServerEvent is called from the
// sideband's reader, concurrently with Event and other sidebands' calls,
// and must not block for long; data is only valid during the call.
type ServerEvents interface {
	ServerEvent(data []byte)
}
