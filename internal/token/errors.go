package token

import "errors"

// Sentinel errors returned by Verify, Encode and Mint. Verify returns them
// unwrapped so that it stays allocation-free; callers that log or return
// them should wrap with context. Each maps to a distinct drop-counter label
// through ReasonOf.
var (
	// ErrLength means the ufrag is not exactly EncodedLen characters.
	ErrLength = errors.New("token: wrong length")
	// ErrAlphabet means the ufrag holds a character outside the standard
	// base64 alphabet (A-Z a-z 0-9 + /); padding, URL-safe characters and
	// whitespace are all rejected.
	ErrAlphabet = errors.New("token: character outside base64 alphabet")
	// ErrVersion means the version nibble is not Version.
	ErrVersion = errors.New("token: unknown version")
	// ErrUnknownKey means the key ID is not configured in the keyring.
	ErrUnknownKey = errors.New("token: unknown key ID")
	// ErrCluster means the cluster ID is 0, which is never valid.
	ErrCluster = errors.New("token: invalid cluster ID 0")
	// ErrMAC means the MAC does not match: the token was forged, corrupted,
	// or minted with a key this relay does not hold.
	ErrMAC = errors.New("token: bad MAC")
)

// Reason is a typed drop reason for a verification failure: a small
// integer that indexes a preallocated counter (udpio.Drops), so counting a
// drop needs no string building or map lookup.
type Reason uint8

// Drop reasons; ReasonOther is any error this package does not know.
const (
	ReasonOther Reason = iota
	ReasonLength
	ReasonAlphabet
	ReasonVersion
	ReasonUnknownKey
	ReasonCluster
	ReasonMAC
	numReasons
)

// Reasons lists the label of every Reason, indexed by Reason, so that drop
// counters can be created (at zero) at start-up.
var Reasons = [numReasons]string{
	ReasonOther: "other", ReasonLength: "length", ReasonAlphabet: "alphabet", ReasonVersion: "version",
	ReasonUnknownKey: "unknown_key", ReasonCluster: "cluster", ReasonMAC: "mac",
}

// reasonErrs is the sentinel of every Reason but ReasonOther, indexed by it.
var reasonErrs = [numReasons]error{nil, ErrLength, ErrAlphabet, ErrVersion, ErrUnknownKey, ErrCluster, ErrMAC}

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
