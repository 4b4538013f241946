package token

import "errors"

// Sentinel errors returned by Verify, Encode and Mint. Verify returns them
// unwrapped so that it stays allocation-free; callers that log or return
// them should wrap with context. Each maps to a distinct drop-counter label
// through Reason.
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

// Reasons lists every label Reason can return, so that drop counters can be
// initialised to zero at start-up.
var Reasons = []string{"length", "alphabet", "version", "unknown_key", "cluster", "mac", "other"}

// Reason returns a short, stable metric label for an error from this
// package ("other" for any error it does not know, "" for nil).
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrLength):
		return "length"
	case errors.Is(err, ErrAlphabet):
		return "alphabet"
	case errors.Is(err, ErrVersion):
		return "version"
	case errors.Is(err, ErrUnknownKey):
		return "unknown_key"
	case errors.Is(err, ErrCluster):
		return "cluster"
	case errors.Is(err, ErrMAC):
		return "mac"
	default:
		return "other"
	}
}
