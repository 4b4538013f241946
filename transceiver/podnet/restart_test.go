package podnet

import (
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
