package podnet

import (
	"fmt"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"
)

// check builds a client's Binding Request.
func check(t *testing.T, username, pwd string) *stun.Message {
	t.Helper()
	m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(username),
		ice.PriorityAttr(1234), ice.AttrControlling(99), ice.UseCandidate(), stun.NewShortTermIntegrity(pwd), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRestartRewrite: a check signed with a restarted session's new
// credentials reaches Pion as a check of the credentials its agent knows
// (same transaction, same attributes), and Pion's answer leaves signed
// with the new password; anything else passes untouched.
func TestRestartRewrite(t *testing.T) {
	rt := &restartTable{}
	rt.init(NewMetrics())
	s := &fakeSession{}
	const newUfrag, newPwd = "NEWSERVERUFRAG000000", "newserverpassword0000000"
	a := &iceAlias{session: s, serverPwd: newPwd, client: Creds{Ufrag: "newc"}, origPwd: "oldserverpassword000000",
		username: "OLDSERVERUFRAG000000:oldclientufrag"}
	rt.set(newUfrag, a)
	now := time.Now()

	in := check(t, newUfrag+":newc", newPwd)
	buf := make([]byte, 1501)
	n := copy(buf, in.Raw)
	n = rt.rewriteIn(buf, n, now)
	got := &stun.Message{Raw: append([]byte(nil), buf[:n]...)}
	if err := got.Decode(); err != nil {
		t.Fatal(err)
	}
	var u stun.Username
	if err := u.GetFrom(got); err != nil || u.String() != a.username {
		t.Fatalf("rewritten USERNAME %q (%v), want %q", u, err, a.username)
	}
	if err := stun.NewShortTermIntegrity(a.origPwd).Check(got); err != nil {
		t.Fatalf("rewritten check does not verify with the agent's password: %v", err)
	}
	if err := stun.Fingerprint.Check(got); err != nil {
		t.Fatalf("fingerprint: %v", err)
	}
	if got.TransactionID != in.TransactionID || !got.Contains(stun.AttrUseCandidate) || !got.Contains(stun.AttrPriority) {
		t.Fatal("rewritten check lost its transaction or attributes")
	}

	// Pion's answer, signed with the agent's password, leaves re-signed.
	resp, err := stun.Build(stun.NewTransactionIDSetter(in.TransactionID), stun.BindingSuccess,
		&stun.XORMappedAddress{IP: []byte{127, 0, 0, 9}, Port: 4000}, stun.NewShortTermIntegrity(a.origPwd), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	out := &stun.Message{Raw: rt.rewriteOut(resp.Raw)}
	if err := out.Decode(); err != nil {
		t.Fatal(err)
	}
	if err := stun.NewShortTermIntegrity(newPwd).Check(out); err != nil {
		t.Fatalf("answer not signed with the new password: %v", err)
	}
	if again := rt.rewriteOut(resp.Raw); &again[0] != &resp.Raw[0] {
		t.Error("a second answer to the same transaction was rewritten")
	}

	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"old credentials", check(t, a.username, a.origPwd).Raw},
		{"wrong password", check(t, newUfrag+":newc", "guessedpassword00000000").Raw},
		{"wrong client ufrag", check(t, newUfrag+":othr", newPwd).Raw},
		{"not STUN", []byte{0x80, 0x6f, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := copy(buf, tc.msg)
			if m := rt.rewriteIn(buf, n, now); m != n || string(buf[:m]) != string(tc.msg) {
				t.Fatal("datagram was rewritten")
			}
		})
	}
	rt.forget(s)
	n = copy(buf, in.Raw)
	if m := rt.rewriteIn(buf, n, now); m != n || string(buf[:n]) != string(in.Raw) {
		t.Fatal("check rewritten after the session was forgotten")
	}
}

// restartHotPath is the table with one restarted session and two datagrams
// the pod sees all the time: SRTP, and a check of another session.
func restartHotPath(t testing.TB) (*restartTable, []byte, []byte) {
	rt := &restartTable{}
	rt.init(NewMetrics())
	rt.set("NEWSERVERUFRAG000000", &iceAlias{session: &fakeSession{}, serverPwd: "newserverpassword0000000", client: Creds{Ufrag: "newc"}})
	srtp := make([]byte, 120)
	srtp[0], srtp[1] = 0x80, 0x6f
	m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername("OTHERSESSIONUFRAG000:abcd"),
		stun.NewShortTermIntegrity("otherpassword00000000000"), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	return rt, srtp, m.Raw
}

// TestRestartHotPathAllocs: what a pod with restarted sessions does for
// every other datagram allocates nothing.
func TestRestartHotPathAllocs(t *testing.T) {
	rt, srtp, other := restartHotPath(t)
	buf := make([]byte, 1501)
	now := time.Now()
	if n := testing.AllocsPerRun(100, func() {
		rt.rewriteIn(buf, copy(buf, srtp), now)
		rt.rewriteIn(buf, copy(buf, other), now)
		_ = rt.rewriteOut(srtp)
	}); n != 0 {
		t.Errorf("%v allocations per datagram, want 0", n)
	}
}

func BenchmarkRestartRewriteInOther(b *testing.B) {
	rt, _, other := restartHotPath(b)
	buf := make([]byte, 1501)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		rt.rewriteIn(buf, copy(buf, other), now)
	}
}

// TestRestartStatePerSession: a session holds its current and previous
// restarted credentials and no more, and one session restarting over and
// over while flooding unanswered checks on its new credentials leaves
// another session's restart working: its check is translated and Pion's
// answer leaves signed with its new password (a pod-wide table of
// translated checks let one session fill it).
func TestRestartStatePerSession(t *testing.T) {
	rt := &restartTable{}
	rt.init(NewMetrics())
	now := time.Now()
	buf := make([]byte, 1501)
	const origPwd = "oldserverpassword000000"
	alias := func(s Session, ufrag, pwd string) *iceAlias {
		return &iceAlias{session: s, ufrag: ufrag, serverPwd: pwd, client: Creds{Ufrag: "newc", Pwd: "newclientpassword000000"},
			origPwd: origPwd, username: "OLDSERVERUFRAG000000:oldclientufrag"}
	}
	translated := func(ufrag, pwd string) (*stun.Message, bool) {
		in := check(t, ufrag+":newc", pwd)
		n := copy(buf, in.Raw)
		return in, rt.rewriteIn(buf, n, now) != n || string(buf[:n]) != string(in.Raw)
	}

	attacker := &fakeSession{}
	ufrag := func(i int) string { return fmt.Sprintf("ATTACKERUFRAG%07d", i) }
	for i := range 1000 {
		rt.set(ufrag(i), alias(attacker, ufrag(i), fmt.Sprintf("attackerpassword%08d", i)))
	}
	if _, ok := translated(ufrag(999), "attackerpassword00000999"); !ok {
		t.Fatal("the current restart's check was not translated")
	}
	if _, ok := translated(ufrag(998), "attackerpassword00000998"); !ok {
		t.Fatal("the previous restart's check was not translated")
	}
	if _, ok := translated(ufrag(997), "attackerpassword00000997"); ok {
		t.Fatal("a check on credentials two restarts old was translated")
	}
	if n := len(rt.byUfrag); n != 2 {
		t.Fatalf("%d restarted credentials held for one session, want 2", n)
	}
	for range 3 * 4096 { // never answered
		if _, ok := translated(ufrag(999), "attackerpassword00000999"); !ok {
			t.Fatal("check not translated")
		}
	}

	victim := &fakeSession{}
	const vUfrag, vPwd = "VICTIMSERVERUFRAG000", "victimserverpassword0000"
	rt.set(vUfrag, alias(victim, vUfrag, vPwd))
	in, ok := translated(vUfrag, vPwd)
	if !ok {
		t.Fatal("the other session's check was not translated")
	}
	resp, err := stun.Build(stun.NewTransactionIDSetter(in.TransactionID), stun.BindingSuccess,
		&stun.XORMappedAddress{IP: []byte{127, 0, 0, 9}, Port: 4000}, stun.NewShortTermIntegrity(origPwd), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	out := &stun.Message{Raw: rt.rewriteOut(resp.Raw)}
	if err := out.Decode(); err != nil {
		t.Fatal(err)
	}
	if err := stun.NewShortTermIntegrity(vPwd).Check(out); err != nil {
		t.Fatalf("the other session's answer is not signed with its new password: %v", err)
	}
	if n := len(rt.pending); n > 2*maxTranslatedPerSession {
		t.Errorf("%d translated checks held for two sessions, want at most %d", n, 2*maxTranslatedPerSession)
	}
	rt.forget(attacker)
	rt.forget(victim)
	if len(rt.pending) != 0 || len(rt.byUfrag) != 0 || len(rt.bySession) != 0 {
		t.Errorf("state left after both sessions ended: %d checks, %d credentials, %d sessions", len(rt.pending), len(rt.byUfrag), len(rt.bySession))
	}
}
