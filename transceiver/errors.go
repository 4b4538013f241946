package transceiver

// The transceiver's sentinel errors and what each means to a caller of
// the API.

import "errors"

// Errors of CreateSession and EndSession. The session API maps them to HTTP
// status codes; signaling treats ErrDraining and ErrFull as "try elsewhere".
var (
	// ErrDraining: the pod is draining and takes no new sessions.
	ErrDraining = errors.New("transceiver: draining")
	// ErrFull: the pod holds MaxSessions sessions already.
	ErrFull = errors.New("transceiver: at capacity")
	// ErrBadOffer: the SDP offer was rejected; the wrapped error says why.
	ErrBadOffer = errors.New("transceiver: bad offer")
	// ErrBadPOP: the POPs to advertise are missing, invalid or conflict
	// with a POP ID the pod already knows under another VIP.
	ErrBadPOP = errors.New("transceiver: bad POP list")
	// ErrNotFound: no session with that ID on this pod.
	ErrNotFound = errors.New("transceiver: no such session")
	// ErrClosed: the transceiver has been closed.
	ErrClosed = errors.New("transceiver: closed")
	// ErrBackendEnded: the backend ended the session before its create
	// finished (it refused the call, or its connection closed at once).
	ErrBackendEnded = errors.New("transceiver: the backend ended the session")
)

// Rejection reasons (label of sessions_rejected_total).
const (
	rejectDraining = "draining"
	rejectFull     = "full"
	rejectBadOffer = "bad_offer"
	rejectBadPOP   = "bad_pop"
	rejectInternal = "internal"
	rejectBackend  = "backend" // the backend ended the session while it was created
)
