// The front's one dialog state machine and the table of live dialogs.
// The transactions (retransmissions, CANCEL's 200 and 487) are sipgo's;
// what a call is — placing, answered, confirmed, ended — and what ending
// it frees is decided here, once per call.

package sipfront

import (
	"encoding/json"
	"errors"
	"sync"

	"github.com/emiago/sipgo"

	"github.com/rtcedge/rtcedge/geo"
)

// state is where a dialog is in its life.
type state int

const (
	// statePlacing: the INVITE was taken (100 Trying), the call is being
	// placed on a pod.
	statePlacing state = iota
	// stateAnswered: 200 OK with the pod's SDP sent, no ACK yet.
	stateAnswered
	// stateConfirmed: ACK received; media flows.
	stateConfirmed
	// stateEnded: BYE (either side), CANCEL, a failure or a timeout ended
	// it; everything it held is freed or being freed.
	stateEnded
)

func (s state) String() string {
	return [...]string{"placing", "answered", "confirmed", "ended"}[s]
}

// errEnded is a transition refused because the dialog ended meanwhile
// (a CANCEL or BYE raced the placement).
var errEnded = errors.New("sipfront: the dialog has ended")

// dialog is one call. id and trunk are static; the rest is guarded by mu.
type dialog struct {
	// Static after the INVITE made it.
	id    string
	trunk *trunk
	ds    *sipgo.DialogServerSession // the library's view of the dialog (to-tag, routes, BYE)
	// Call control: callID is "" when no webhook decides the call.
	// decide carries the one decision (buffered 1; sent under mu by the
	// claimer); ended is closed when the dialog ends.
	callID string
	decide chan decision
	ended  chan struct{}

	mu sync.Mutex
	// Guarded by mu: the handlers of the dialog's requests (INVITE, ACK,
	// BYE, CANCEL) move the state from the SIP library's goroutines.
	state   state
	session string      // the pod's session ID; "" until placed
	cluster geo.Cluster // the cluster that holds session
	unwatch func()      // cancels the watch of the call's end at its pod (watch.go); nil before
	// claimed: a decision (accept, reject, the accept timeout, a failed
	// webhook) was taken; every later one is refused.
	claimed bool
	// referring is a REFER's outcome channel while one is under way.
	referring chan int
}

// newDialog is a dialog in statePlacing.
func newDialog(id string, t *trunk, ds *sipgo.DialogServerSession) *dialog {
	return &dialog{id: id, trunk: t, ds: ds, decide: make(chan decision, 1), ended: make(chan struct{})}
}

// decision is what decides a ringing call: an accept (status 0) with its
// merged session, or a refusal with its SIP status.
type decision struct {
	status  int
	reason  string
	session json.RawMessage
	// placed receives the accept's outcome (nil once the 200 is sent);
	// buffered 1.
	placed chan error
}

// claim takes the dialog's one decision: false when another was taken or
// the dialog ended. With dec non-nil it is queued for the INVITE's
// goroutine in the same step, so a claimer never leaves it waiting.
func (d *dialog) claim(dec *decision) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.claimed || d.state != statePlacing {
		return false
	}
	d.claimed = true
	if dec != nil {
		d.decide <- *dec
	}
	return true
}

// placed records where the call was placed and moves it to answered:
// errEnded when it ended meanwhile (the caller then deletes the session
// itself, since end did not see it).
func (d *dialog) placed(session string, cluster geo.Cluster) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != statePlacing {
		return errEnded
	}
	d.session, d.cluster, d.state = session, cluster, stateAnswered
	return nil
}

// confirm moves an answered dialog to confirmed (its ACK); false for any
// other state.
func (d *dialog) confirm() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != stateAnswered {
		return d.state == stateConfirmed // a retransmitted ACK
	}
	d.state = stateConfirmed
	return true
}

// end moves the dialog to ended and returns what the caller must free:
// the session (empty when none was placed) and its cluster, and from
// which state it ended. ok is false when it had ended already: exactly one
// caller frees a dialog.
func (d *dialog) end() (session string, cluster geo.Cluster, from state, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == stateEnded {
		return "", geo.Cluster{}, stateEnded, false
	}
	from, d.state = d.state, stateEnded
	close(d.ended)
	return d.session, d.cluster, from, true
}

// current is the dialog's state now.
func (d *dialog) current() state {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state
}

// dialogs is the table of live dialogs by SIP dialog ID, bounded. Safe
// for concurrent use.
type dialogs struct {
	max int // static

	mu sync.Mutex
	m  map[string]*dialog // guarded by mu
}

func newDialogs(max int) *dialogs { return &dialogs{max: max, m: map[string]*dialog{}} }

// add inserts d: false when the table is full or the ID is taken.
func (t *dialogs) add(d *dialog) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) >= t.max {
		return false
	}
	if _, dup := t.m[d.id]; dup {
		return false
	}
	t.m[d.id] = d
	return true
}

func (t *dialogs) get(id string) *dialog {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

func (t *dialogs) remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, id)
}

func (t *dialogs) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// all is a snapshot of the live dialogs.
func (t *dialogs) all() []*dialog {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*dialog, 0, len(t.m))
	for _, d := range t.m {
		out = append(out, d)
	}
	return out
}
