package membership

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func keyedConfig(name string, primary []byte, more ...[]byte) Config {
	cfg := testConfig(name)
	cfg.SecretKey, cfg.Keys, cfg.AllowInsecure = primary, more, false
	return cfg
}

// joins reports whether a pool with cfg can join seed.
func joins(t *testing.T, seed *Pool, cfg Config) bool {
	t.Helper()
	p := newTestPoolCfg(t, cfg, Meta{Role: RoleGlobalRelay})
	_, err := p.Join([]string{seed.LocalAddr().String()})
	if err == nil {
		await(t, seed, cfg.Name, hasMember(cfg.Name, inState(StateAlive)))
	}
	return err == nil
}

// TestKeyRotation rotates a pool's key without a partition, the way
// docs/operations.md describes: install the new key everywhere, use it
// everywhere, remove the old one. Before, only the old key opens the
// pool; after, only the new one.
func TestKeyRotation(t *testing.T) {
	old, next := []byte("old-key-0123456789abcdef"), []byte("new-key-0123456789abcdef")
	a := newTestPoolCfg(t, keyedConfig("rot-a", old), Meta{Role: RoleGlobalRelay})
	b := newTestPoolCfg(t, keyedConfig("rot-b", old), Meta{Role: RoleGlobalRelay})
	if _, err := b.Join([]string{a.LocalAddr().String()}); err != nil {
		t.Fatal(err)
	}
	if joins(t, a, keyedConfig("new-before", next)) {
		t.Fatal("a member with only the new key joined before the rotation")
	}
	for _, p := range []*Pool{a, b} {
		if err := p.InstallKey(next); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*Pool{a, b} {
		if err := p.UseKey(next); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*Pool{a, b} {
		if err := p.RemoveKey(old); err != nil {
			t.Fatal(err)
		}
		if ks := p.Keys(); len(ks) != 1 || string(ks[0]) != string(next) {
			t.Fatalf("keys after rotation: %q", ks)
		}
	}
	if !joins(t, a, keyedConfig("new-after", next)) {
		t.Fatal("a member with the new key cannot join after the rotation")
	}
	if joins(t, a, keyedConfig("old-after", old)) {
		t.Fatal("a member with only the old key joined after the rotation")
	}
	// a and b still see each other: the rotation partitioned nothing.
	await(t, a, "b alive", hasMember("rot-b", inState(StateAlive)))
}

// TestKeysFromConfig: a restarted member configured with the new primary
// and the old key accepted (step 2 of a rotation done by rolling restarts)
// talks to members still on the old primary.
func TestKeysFromConfig(t *testing.T) {
	old, next := []byte("old-key-0123456789abcdef"), []byte("new-key-0123456789abcdef")
	a := newTestPoolCfg(t, keyedConfig("cfg-a", old, next), Meta{Role: RoleGlobalRelay})
	if !joins(t, a, keyedConfig("cfg-b", next, old)) {
		t.Fatal("new-primary member could not join an old-primary one holding the new key")
	}
	if _, err := New(keyedConfig("cfg-c", old, []byte("short")), Meta{Role: RoleGlobalRelay}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a 5-byte key: %v, want ErrInvalidConfig", err)
	}
}

// TestCheckMeta: members whose meta the catalogue check refuses are left
// out of Members and counted; others are listed.
func TestCheckMeta(t *testing.T) {
	cfg := testConfig("checker")
	cfg.CheckMeta = func(m Meta) error {
		if m.Capacity > 100 {
			return errors.New("capacity out of bounds")
		}
		return nil
	}
	p := newTestPoolCfg(t, cfg, Meta{Role: RoleSignaling})
	sub := p.Subscribe() // every observation signals, refused or not
	honest := newTestPoolCfg(t, testConfig("honest"), Meta{Role: RoleClusterRelay, Cluster: 1, Capacity: 50})
	rogue := newTestPoolCfg(t, testConfig("rogue"), Meta{Role: RoleClusterRelay, Cluster: 1, Capacity: 1_000_000})
	for _, q := range []*Pool{honest, rogue} {
		if _, err := q.Join([]string{p.LocalAddr().String()}); err != nil {
			t.Fatal(err)
		}
	}
	await(t, p, "honest", hasMember("honest", inState(StateAlive)))
	deadline := time.Now().Add(awaitTimeout)
	for p.badMeta.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("refused meta never counted")
		}
		select {
		case <-sub:
		case <-time.After(time.Until(deadline)):
		}
	}
	if _, ok := find(p.Members(), "rogue"); ok {
		t.Fatalf("member with refused meta listed: %+v", p.Members())
	}
	// A member that later advertises bad meta is dropped too.
	if err := honest.UpdateMeta(func(m *Meta) { m.Capacity = 5000 }); err != nil {
		t.Fatal(err)
	}
	await(t, p, "honest dropped", func(ms []Member) bool { _, ok := find(ms, "honest"); return !ok })
}

// TestRecheckAfterKeyReload: a member refused by CheckMember is admitted
// by Recheck once the check accepts it (a key installed), and dropped by
// Recheck once it no longer does (a key removed), with no metadata
// update of its own in between.
func TestRecheckAfterKeyReload(t *testing.T) {
	var accept atomic.Bool
	cfg := testConfig("checker")
	cfg.CheckMember = func(m Member, _ []byte) error {
		if m.Name == "member" && !accept.Load() {
			return errors.New("no key for it")
		}
		return nil
	}
	p := newTestPoolCfg(t, cfg, Meta{Role: RoleSignaling})
	q := newTestPoolCfg(t, testConfig("member"), Meta{Role: RoleClusterRelay, Cluster: 1})
	if _, err := q.Join([]string{p.LocalAddr().String()}); err != nil {
		t.Fatal(err)
	}
	await(t, q, "the checker", hasMember("checker", inState(StateAlive)))
	deadline := time.Now().Add(awaitTimeout)
	for p.badMeta.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the refusal never counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	accept.Store(true)
	p.Recheck()
	if _, ok := find(p.Members(), "member"); !ok {
		t.Fatal("Recheck did not admit a member the check now accepts")
	}
	accept.Store(false)
	p.Recheck()
	if _, ok := find(p.Members(), "member"); ok {
		t.Fatal("Recheck kept a member the check now refuses")
	}
}
