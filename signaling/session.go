package signaling

import "github.com/rtcedge/rtcedge/placement"

// DefaultClientSessionFields are the top-level session fields a browser
// holding a client secret may set in the "session" part of a /calls offer
// when Config.ClientSessionFields is nil: how the call sounds and is
// transcribed, never what it costs or what the model is told. The model,
// instructions, tools, prompt and tracing are the app server's, fixed when
// it mints the secret.
var DefaultClientSessionFields = []string{
	"type", "voice", "speed", "audio", "turn_detection",
	"input_audio_format", "output_audio_format", "input_audio_transcription", "input_audio_noise_reduction",
	"modalities", "output_modalities", "temperature", "max_response_output_tokens", "max_output_tokens", "include",
}

// sessionFieldError names a client session field that may not be set.
type sessionFieldError = placement.FieldError

// canonicalSession and mergeSession are the shared placement's session
// merge (placement/session.go).
var (
	canonicalSession = placement.CanonicalSession
	mergeSession     = placement.MergeSession
)
