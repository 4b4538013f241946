package membership

import "errors"

// Sentinel errors returned (wrapped with context) by this package. Callers
// test for them with errors.Is.
var (
	// ErrInvalidConfig means a Config failed validation in New: a missing
	// name, an invalid bind address, a secret key of the wrong length, or no
	// key without AllowInsecure.
	ErrInvalidConfig = errors.New("membership: invalid config")

	// ErrMetaTooLarge means the encoded Meta does not fit memberlist's
	// per-node metadata limit (MetaMaxSize bytes). New refuses to start and
	// UpdateMeta leaves the previous meta in place.
	ErrMetaTooLarge = errors.New("membership: meta too large")

	// ErrMalformedMeta means a member's metadata could not be decoded: it is
	// truncated, has an unknown version, or a length runs past the end. Such
	// members are left out of Members and counted, never trusted.
	ErrMalformedMeta = errors.New("membership: malformed meta")

	// ErrRefusedMeta means a member's metadata decoded but Config.CheckMeta
	// refused it (an unknown cluster, a session API outside the allowed
	// networks, a capacity out of bounds). Such members are left out of
	// Members and counted with the undecodable ones.
	ErrRefusedMeta = errors.New("membership: meta refused")

	// ErrLeft is returned by UpdateMeta after Leave: gossiping new meta
	// would announce the node alive again.
	ErrLeft = errors.New("membership: pool has left")

	// ErrClosed is returned by calls on a Pool after Close.
	ErrClosed = errors.New("membership: pool closed")

	// ErrLingering is returned by Pool.Wait and Group.Wait when their
	// context ends while goroutines of the pools still run.
	ErrLingering = errors.New("membership: goroutines still running")
)
