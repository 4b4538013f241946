package podnet

// The package's sentinel errors, in one place. All are unexported: they
// reach Pion (which only logs or retries them) or tests, never a caller
// that branches on them outside the package. Per-datagram failures are
// also counted by drop reason (metrics.go); the error only tells the
// writer this one datagram went nowhere.

import "errors"

// Errors of writes toward a client.
var (
	// errNoRoute is returned by writes toward a client address that has
	// sent nothing through this pod recently: there is no header to answer
	// with (and for a TCP client, no conn).
	errNoRoute = errors.New("podnet: no relay route to client")
	// errProvisional is returned by writes of anything but STUN toward a
	// client address Pion has not authenticated yet.
	errProvisional = errors.New("podnet: route to client not yet authenticated")
	// errNoSelectedPath is returned for media of a session no pair is
	// selected for yet.
	errNoSelectedPath = errors.New("podnet: no selected candidate pair")
	// errTooLarge is returned by a write whose payload does not fit one
	// encapsulated datagram.
	errTooLarge = errors.New("podnet: datagram too large")
	// errNotUDPAddr and errNotTCPAddr are returned by WriteTo given an
	// address of the other transport.
	errNotUDPAddr = errors.New("podnet: not a UDP address")
	errNotTCPAddr = errors.New("podnet: not a TCP address")
)

// Errors of setting up a POP's conns for Pion.
var (
	// errUfragInUse is returned by GetConn for a ufrag that already has a
	// conn on the POP: every session mints its own, so this is a second
	// gather.
	errUfragInUse = errors.New("podnet: ICE ufrag already has a conn on this POP")
	// errPOPRebound is returned when a POP ID already known is announced
	// with another VIP.
	errPOPRebound = errors.New("podnet: POP ID already bound to another VIP")
	// errNotUDPConn is returned when duplicating the pod's socket does not
	// give a UDP conn back.
	errNotUDPConn = errors.New("podnet: duplicate is not a UDP conn")
	// errBadLocalAddr is returned to Pion's TCP mux for a local address
	// that is not an IP.
	errBadLocalAddr = errors.New("podnet: bad local address")
	// errNoTCPPOP is returned to Pion's TCP mux when no POP with an ICE-TCP
	// port has the local address.
	errNoTCPPOP = errors.New("podnet: no TCP POP at that address")
	// errNoInterface is returned by the virtual network's interface
	// lookups for anything but its one interface.
	errNoInterface = errors.New("podnet: no such interface")
)
