package membership

import (
	"net/netip"
	"strconv"
)

// State is a member's liveness as seen by the local node.
type State int

// Member states. memberlist reports no event when a member becomes
// suspect, so the pool reports a member Alive until it is declared dead or
// leaves; StateSuspect is kept for API completeness (see README).
const (
	StateAlive State = iota
	StateSuspect
	StateDead
	StateLeft
)

// States lists every State, in a stable order (metrics pre-create a series
// for each).
var States = []State{StateAlive, StateSuspect, StateDead, StateLeft}

// String returns "alive", "suspect", "dead" or "left"; it doubles as the
// metric label.
func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// Member is one node of a pool as seen by the local node: its gossip
// address, its decoded metadata and its liveness.
type Member struct {
	Name  string
	Addr  netip.AddrPort // gossip address
	Meta  Meta
	State State
}
