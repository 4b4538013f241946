package stunmsg

import "errors"

// Sentinel errors. Username and ServerUfrag return them unwrapped so that
// they stay allocation-free; ReasonOf maps each to a drop reason.
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

// Reason is a typed drop reason for a parse failure: a small integer that
// indexes a preallocated counter (udpio.Drops), so counting a drop needs no
// string building or map lookup.
type Reason uint8

// Drop reasons; ReasonOther is any error this package does not know.
const (
	ReasonOther Reason = iota
	ReasonNotSTUN
	ReasonNotBinding
	ReasonNoUsername
	ReasonMalformed
	ReasonNoColon
	numReasons
)

// Reasons lists the label of every Reason, indexed by Reason, so that drop
// counters can be created (at zero) at start-up.
var Reasons = [numReasons]string{
	ReasonOther: "other", ReasonNotSTUN: "not_stun", ReasonNotBinding: "not_binding",
	ReasonNoUsername: "no_username", ReasonMalformed: "malformed", ReasonNoColon: "no_colon",
}

// reasonErrs is the sentinel of every Reason but ReasonOther, indexed by it.
var reasonErrs = [numReasons]error{nil, ErrNotSTUN, ErrNotBindingRequest, ErrNoUsername, ErrMalformed, ErrNoColon}

// ReasonOf maps an error from this package to its drop reason, without
// allocating (the hot path gets the sentinels bare).
func ReasonOf(err error) Reason {
	for r, e := range reasonErrs {
		if r > 0 && (err == e || errors.Is(err, e)) {
			return Reason(r)
		}
	}
	return ReasonOther
}
