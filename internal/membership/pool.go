// Package membership wraps hashicorp/memberlist into the gossip pools that
// relays, transceivers and signaling use to find each other and to learn
// each other's health, load and draining state.
//
// A Pool is one node's membership in one pool: the cluster pool (LAN
// timings: cluster relays and transceiver pods of one cluster) or the global
// pool (WAN timings: global relays, cluster relays and signaling fronts of
// all regions). Each member publishes a small Meta; Members returns the
// current view and Subscribe signals every change, so consumers rebuild
// their routing tables on change instead of polling.
package membership

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Pool is one node's membership in a gossip pool. It is safe for concurrent
// use. Create it with New, then Join; Close it when done.
type Pool struct {
	// Static after New.
	ml        *memberlist.Memberlist
	name      string
	localAddr netip.AddrPort
	log       *slog.Logger
	retention time.Duration // how long dead/left members stay in Members
	updateTO  time.Duration // how long UpdateMeta waits for its broadcast
	checkMeta func(Meta) error
	prove     func([]byte) []byte
	checkMbr  func(Member, []byte) error
	keyring   *memberlist.Keyring // nil without a secret key; safe for concurrent use
	label     string              // pprof label value of the pool's goroutines (Wait)

	// lifeMu serialises UpdateMeta, Leave and Close: meta changes are
	// gossiped in the order they were made, and memberlist is never asked
	// to update or leave after Shutdown (it panics on Leave after
	// Shutdown). It is never taken by memberlist callbacks, so it may be
	// held across calls into memberlist, unlike mu.
	lifeMu sync.Mutex

	// mu guards the fields below. memberlist calls the delegates with its
	// own node lock held, so nothing under mu may call into memberlist.
	mu      sync.Mutex
	meta    Meta
	metaRaw []byte
	members map[string]*memberEntry
	subs    []chan struct{}
	closed  bool
	leaving bool // Leave was called: meta carries flagLeaving from now on

	handler   atomic.Pointer[func([]byte)] // user messages (SetHandler)
	badMeta   atomic.Uint64                // member metadata that failed to decode
	deaths    atomic.Uint64                // members declared dead, for alerts after they are forgotten
	closeOnce sync.Once
}

// memberEntry is the pool's record of one node, kept across death so that
// Members can report dead and left nodes for a while.
type memberEntry struct {
	member Member
	// node is a copy of what memberlist last told of the member (name,
	// address, meta), taken in its event callback: Recheck judges this copy,
	// since the *Node memberlist hands out is its own, updated under its
	// node lock while we read.
	node    memberlist.Node
	ok      bool      // meta decoded; members with bad meta are not reported
	leaving bool      // last meta announced a graceful leave
	gone    time.Time // when it was declared dead or left; zero while alive
}

// New validates cfg and meta, creates the memberlist (binding cfg.Bind) and
// returns a pool that knows only itself. It does not join anyone: call Join.
func New(cfg Config, meta Meta) (*Pool, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("membership: new pool: %w", err)
	}
	raw, err := encodeProved(meta, false, cfg.Name, cfg.Prove)
	if err != nil {
		return nil, fmt.Errorf("membership: new pool %q: %w", cfg.Name, err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "membership", "node", cfg.Name)

	mc := cfg.memberlistConfig()
	p := &Pool{
		name:      cfg.Name,
		log:       logger,
		retention: mc.GossipToTheDeadTime,
		updateTO:  max(time.Second, 20*mc.GossipInterval),
		meta:      meta,
		metaRaw:   raw,
		members:   make(map[string]*memberEntry),
		checkMeta: cfg.CheckMeta,
		prove:     cfg.Prove,
		checkMbr:  cfg.CheckMember,
		keyring:   mc.Keyring,
		label:     nextLabel("p"),
	}
	mc.Delegate = (*delegate)(p)
	mc.Events = (*events)(p)
	// memberlist logs chatty protocol detail with its own "[LEVEL]" prefix;
	// all of it goes to debug so that the pool's own join/leave/dead logs
	// are what operators see.
	mc.Logger = slog.NewLogLogger(logger.Handler(), slog.LevelDebug)
	mc.LogOutput = nil

	// Every goroutine memberlist starts, here or later from one of its own,
	// inherits these labels, which is how Wait finds them. (The calling
	// goroutine's own pprof labels, if it had any, are cleared by Do.)
	labels := []string{poolLabel, p.label}
	if cfg.Group != nil {
		labels = append(labels, groupLabel, cfg.Group.label)
	}
	var ml *memberlist.Memberlist
	pprof.Do(context.Background(), pprof.Labels(labels...), func(context.Context) {
		ml, err = memberlist.Create(mc)
	})
	if err != nil {
		return nil, fmt.Errorf("membership: create memberlist %q on %v: %w", cfg.Name, cfg.Bind, err)
	}
	p.ml = ml
	// Read once: the local address changes only through our own alive
	// messages, which carry the same address.
	self := ml.LocalNode()
	if ip, ok := netip.AddrFromSlice(self.Addr); ok {
		p.localAddr = netip.AddrPortFrom(ip.Unmap(), self.Port)
	}
	return p, nil
}

// Join contacts the seeds ("host:port" gossip addresses) and syncs state
// with each that answers. It returns how many answered; the error is set
// only when none did.
func (p *Pool) Join(seeds []string) (int, error) {
	if p.isClosed() {
		return 0, fmt.Errorf("membership: join: %w", ErrClosed)
	}
	n, err := p.ml.Join(seeds)
	if err != nil {
		return n, fmt.Errorf("membership: join %s: %w", strings.Join(seeds, ","), err)
	}
	return n, nil
}

// LocalAddr returns the gossip address others reach this node at (the
// advertise address, else the bound one with the port actually chosen).
func (p *Pool) LocalAddr() netip.AddrPort { return p.localAddr }

// Name returns this node's name in the pool.
func (p *Pool) Name() string { return p.name }

// LocalMeta returns this node's current metadata.
func (p *Pool) LocalMeta() Meta {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.meta
}

// UpdateMeta applies fn to a copy of this node's metadata and, if the result
// encodes within MetaMaxSize, adopts and gossips it. It blocks until the
// update has been broadcast or a bounded wait (about 20 gossip intervals,
// at least 1 s) expires; on that timeout the new meta is already in effect
// locally and still spreads through push-pull, but the error says its
// broadcast was not confirmed. An oversized result leaves the old meta in
// place and returns ErrMetaTooLarge. After Leave it returns ErrLeft.
func (p *Pool) UpdateMeta(fn func(*Meta)) error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("membership: update meta: %w", ErrClosed)
	}
	if p.leaving {
		// memberlist would re-announce the node as alive, undoing Leave.
		p.mu.Unlock()
		return fmt.Errorf("membership: update meta: %w", ErrLeft)
	}
	next := p.meta
	p.mu.Unlock()

	// fn runs without mu so it may call LocalMeta or Members; lifeMu keeps
	// concurrent UpdateMeta calls from losing each other's changes.
	fn(&next)
	raw, err := encodeProved(next, false, p.name, p.prove)
	if err != nil {
		return fmt.Errorf("membership: update meta: %w", err)
	}
	p.mu.Lock()
	p.meta, p.metaRaw = next, raw
	p.mu.Unlock()

	if err := p.ml.UpdateNode(p.updateTO); err != nil {
		return fmt.Errorf("membership: gossip meta update: %w", err)
	}
	return nil
}

// Members returns the members this node knows, sorted by name: alive ones,
// plus dead and left ones for the memberlist gossip-to-the-dead time after
// they went (LAN 30 s, WAN 60 s, Fast 5 s). This node is included. Members
// whose metadata failed to decode are left out.
func (p *Pool) Members() []Member {
	now := time.Now()
	p.mu.Lock()
	out := make([]Member, 0, len(p.members))
	for name, e := range p.members {
		if !e.gone.IsZero() && now.Sub(e.gone) > p.retention {
			delete(p.members, name)
			continue
		}
		if e.ok {
			out = append(out, e.member)
		}
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Subscribe returns a channel that receives a value whenever a member joins,
// leaves, dies, or changes its metadata. Signals are coalesced (buffer of
// one): after a receive, call Members for the current view. The channel is
// closed by Close.
func (p *Pool) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		close(ch)
		return ch
	}
	p.subs = append(p.subs, ch)
	return ch
}

// Leave announces this node's departure so that others mark it StateLeft
// at once instead of detecting it as dead, and waits until the announcement
// is gossiped or timeout passes (timeout <= 0 means the UpdateMeta bound).
// The node keeps answering gossip until Close. Repeated calls are no-ops.
func (p *Pool) Leave(timeout time.Duration) error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.isClosed() {
		return fmt.Errorf("membership: leave: %w", ErrClosed)
	}
	if timeout <= 0 {
		timeout = p.updateTO // memberlist would wait forever on 0
	}
	// First gossip a meta with the leaving flag, so that receivers of the
	// leave message can report StateLeft rather than StateDead (see
	// flagLeaving). The meta already fit, and the flag costs no bytes.
	p.mu.Lock()
	first := !p.leaving
	if first {
		p.leaving = true
		p.metaRaw, _ = encodeProved(p.meta, true, p.name, p.prove)
	}
	p.mu.Unlock()
	if first {
		if err := p.ml.UpdateNode(timeout); err != nil {
			// Not fatal: the leave still goes out; a receiver that
			// missed the flag reports the member dead instead of left.
			p.log.Debug("leaving flag not confirmed before leave", "err", err)
		}
	}
	if err := p.ml.Leave(timeout); err != nil {
		return fmt.Errorf("membership: leave: %w", err)
	}
	return nil
}

// Close shuts the memberlist down without a leave message (call Leave first
// for a graceful exit), and closes all Subscribe channels. It is idempotent.
// It returns before a probe in flight ends (memberlist does not stop it):
// Wait, or Group.Wait, waits for that.
func (p *Pool) Close() error {
	var err error
	p.closeOnce.Do(func() {
		p.lifeMu.Lock()
		defer p.lifeMu.Unlock()
		p.mu.Lock()
		p.closed = true
		for _, ch := range p.subs {
			close(ch)
		}
		p.subs = nil
		p.mu.Unlock()
		if e := p.ml.Shutdown(); e != nil {
			err = fmt.Errorf("membership: shutdown: %w", e)
		}
	})
	return err
}

func (p *Pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// notifyLocked signals every subscriber without blocking; mu must be held.
func (p *Pool) notifyLocked() {
	for _, ch := range p.subs {
		select {
		case ch <- struct{}{}:
		default: // a signal is already pending; coalesce
		}
	}
}

// observeLocked records what memberlist says about node; mu must be held.
func (p *Pool) observeLocked(n *memberlist.Node, state State) {
	e := p.members[n.Name]
	if e == nil {
		e = &memberEntry{}
		p.members[n.Name] = e
	}
	isNew := e.member.Name == ""
	if n != &e.node {
		e.node = memberlist.Node{Name: n.Name, Addr: slices.Clone(n.Addr), Port: n.Port, Meta: slices.Clone(n.Meta)}
	}
	e.member.Name = n.Name
	if ip, ok := netip.AddrFromSlice(n.Addr); ok {
		e.member.Addr = netip.AddrPortFrom(ip.Unmap(), n.Port)
	}
	e.member.State = state
	if state == StateDead || state == StateLeft {
		e.gone = time.Now()
	} else {
		e.gone = time.Time{}
	}
	m, leaving, signed, err := decodeMeta(n.Meta)
	if err == nil && p.checkMeta != nil && n.Name != p.name {
		if cerr := p.checkMeta(m); cerr != nil {
			err = fmt.Errorf("%w: %w", ErrRefusedMeta, cerr)
		}
	}
	if err == nil && p.checkMbr != nil && n.Name != p.name {
		mb := e.member
		mb.Meta = m
		if cerr := p.checkMbr(mb, ProofInput(n.Name, n.Meta[:signed])); cerr != nil {
			err = fmt.Errorf("%w: %w", ErrRefusedMeta, cerr)
		}
	}
	if err != nil {
		p.badMeta.Add(1)
		if e.ok || isNew {
			p.log.Warn("member meta refused; member ignored", "member", n.Name, "err", err)
		}
		e.ok = false
		return
	}
	e.member.Meta = m
	e.leaving = leaving
	e.ok = true
	if state == StateDead && leaving {
		e.member.State = StateLeft
	}
}

// Recheck runs CheckMeta and CheckMember again over every live member's
// last gossiped metadata, as after a key reload: a member proven by a
// key no longer held leaves Members, one proven by a key just installed
// enters it, without waiting for its next metadata update.
func (p *Pool) Recheck() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, e := range p.members {
		if e.gone.IsZero() && name != p.name {
			p.observeLocked(&e.node, e.member.State)
		}
	}
	p.notifyLocked()
}

// encodeProved encodes meta (with the leaving flag) for the node called
// name, with the proof prove makes when prove is set.
func encodeProved(meta Meta, leaving bool, name string, prove func([]byte) []byte) ([]byte, error) {
	meta.Proof = ""
	raw, err := meta.encode(leaving)
	if err != nil || prove == nil {
		return raw, err
	}
	meta.Proof = string(prove(ProofInput(name, raw)))
	return meta.encode(leaving)
}

// delegate implements memberlist.Delegate: NodeMeta, and NotifyMsg for
// the user messages of messages.go; the pool keeps no state of its own.
type delegate Pool

// NodeMeta returns the encoded local meta. It was size-checked when set.
func (d *delegate) NodeMeta(limit int) []byte {
	p := (*Pool)(d)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.metaRaw) > limit {
		return nil // unreachable: MarshalBinary enforces MetaMaxSize
	}
	return slices.Clone(p.metaRaw)
}

// NotifyMsg hands a user message to the handler (SetHandler).
func (d *delegate) NotifyMsg(msg []byte) {
	if fn := (*Pool)(d).handler.Load(); fn != nil {
		(*fn)(msg)
	}
}

// GetBroadcasts is unused: the pool sends no user broadcasts.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState is unused: all shared state travels as node meta.
func (d *delegate) LocalState(join bool) []byte { return nil }

// MergeRemoteState is unused: all shared state travels as node meta.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {}

// events implements memberlist.EventDelegate. memberlist calls it with its
// node lock held, so it only records and signals.
type events Pool

// NotifyJoin records a new or returning member.
func (e *events) NotifyJoin(n *memberlist.Node) {
	p := (*Pool)(e)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observeLocked(n, StateAlive)
	p.notifyLocked()
	if n.Name != p.name {
		p.log.Info("member joined", "member", n.Name, "addr", net.JoinHostPort(n.Addr.String(), fmt.Sprint(n.Port)))
	}
}

// NotifyUpdate records a member's new metadata.
func (e *events) NotifyUpdate(n *memberlist.Node) {
	p := (*Pool)(e)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observeLocked(n, StateAlive)
	p.notifyLocked()
}

// NotifyLeave records a member that died (detected by probing) or left
// (announced itself). memberlist v0.7.0 leaves node.State at its zero value
// in events, so the leaving flag in the member's last meta decides; the
// node.State check covers memberlist versions that do fill it.
func (e *events) NotifyLeave(n *memberlist.Node) {
	p := (*Pool)(e)
	state := StateDead
	if n.State == memberlist.StateLeft {
		state = StateLeft
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observeLocked(n, state)
	p.notifyLocked()
	if n.Name != p.name && p.members[n.Name].member.State == StateDead {
		p.deaths.Add(1)
	}
	if n.Name != p.name {
		p.log.Info("member gone", "member", n.Name, "state", p.members[n.Name].member.State.String())
	}
}

// Watch calls fn with the pool's members now and after every membership or
// metadata change, until ctx ends or the pool closes. Consumers rebuild
// their view from the whole list each time, so a missed or coalesced
// notification loses nothing.
func (p *Pool) Watch(ctx context.Context, fn func([]Member)) {
	changes := p.Subscribe()
	for {
		fn(p.Members())
		select {
		case <-ctx.Done():
			return
		case _, ok := <-changes:
			if !ok {
				return
			}
		}
	}
}

// InstallKey adds a key to the keyring: this member now also accepts
// messages encrypted with it. Step 1 of a rotation, on every member.
func (p *Pool) InstallKey(key []byte) error {
	kr := p.keyring
	if kr == nil {
		return fmt.Errorf("membership: install key: %w: the pool has no keyring (no secret key)", ErrInvalidConfig)
	}
	if err := kr.AddKey(append([]byte(nil), key...)); err != nil {
		return fmt.Errorf("membership: install key: %w", err)
	}
	return nil
}

// UseKey makes an installed key the primary one, which encrypts
// everything this member sends. Step 2, once every member has installed it.
func (p *Pool) UseKey(key []byte) error {
	kr := p.keyring
	if kr == nil {
		return fmt.Errorf("membership: use key: %w: the pool has no keyring (no secret key)", ErrInvalidConfig)
	}
	if err := kr.UseKey(key); err != nil {
		return fmt.Errorf("membership: use key: %w", err)
	}
	return nil
}

// RemoveKey drops a key that is not the primary one. Step 3, once every
// member uses the new key.
func (p *Pool) RemoveKey(key []byte) error {
	kr := p.keyring
	if kr == nil {
		return fmt.Errorf("membership: remove key: %w: the pool has no keyring (no secret key)", ErrInvalidConfig)
	}
	if err := kr.RemoveKey(key); err != nil {
		return fmt.Errorf("membership: remove key: %w", err)
	}
	return nil
}

// Keys returns the installed keys, the primary first.
func (p *Pool) Keys() [][]byte {
	kr := p.keyring
	if kr == nil {
		return nil
	}
	return kr.GetKeys()
}
