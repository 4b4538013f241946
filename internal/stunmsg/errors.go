package stunmsg

import "errors"

// Sentinel errors. Username and ServerUfrag return them unwrapped so that
// they stay allocation-free; Reason maps each to a drop-counter label.
var (
	// ErrNotSTUN means the datagram is not a well-formed STUN message
	// (see IsSTUN).
	ErrNotSTUN = errors.New("stunmsg: not a STUN message")
	// ErrNotBindingRequest means the message is STUN but not a Binding
	// Request, the only message that may open a flow.
	ErrNotBindingRequest = errors.New("stunmsg: not a Binding Request")
	// ErrNoUsername means the message has no USERNAME attribute before
	// MESSAGE-INTEGRITY.
	ErrNoUsername = errors.New("stunmsg: no USERNAME attribute")
	// ErrMalformed means the attribute list is broken: an attribute header
	// or value (with its padding) runs past the end of the message.
	ErrMalformed = errors.New("stunmsg: malformed attributes")
	// ErrNoColon means the USERNAME is not of the form
	// "serverUfrag:clientUfrag".
	ErrNoColon = errors.New("stunmsg: USERNAME has no colon")
)

// Reasons lists every label Reason can return, so that drop counters can be
// initialised to zero at start-up.
var Reasons = []string{"not_stun", "not_binding", "no_username", "malformed", "no_colon", "other"}

// Reason returns a short, stable metric label for an error from this
// package ("other" for any error it does not know, "" for nil).
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNotSTUN):
		return "not_stun"
	case errors.Is(err, ErrNotBindingRequest):
		return "not_binding"
	case errors.Is(err, ErrNoUsername):
		return "no_username"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, ErrNoColon):
		return "no_colon"
	default:
		return "other"
	}
}
