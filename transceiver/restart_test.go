package transceiver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/testsdp"
)

const clientPwd = "clientpassword0123456789"

func TestICEFragment(t *testing.T) {
	for _, tc := range []struct {
		name, frag string
		ok         bool
	}{
		{"session level", "a=ice-ufrag:abcd\r\na=ice-pwd:" + clientPwd + "\r\n", true},
		{"media level, LF", "m=audio 9 UDP/TLS/RTP/SAVPF 111\na=mid:0\na=ice-ufrag:abcd\na=ice-pwd:" + clientPwd + "\n", true},
		{"no pwd", "a=ice-ufrag:abcd\r\n", false},
		{"short ufrag", "a=ice-ufrag:abc\r\na=ice-pwd:" + clientPwd + "\r\n", false},
		{"short pwd", "a=ice-ufrag:abcd\r\na=ice-pwd:short\r\n", false},
		{"colon in ufrag", "a=ice-ufrag:ab:cd\r\na=ice-pwd:" + clientPwd + "\r\n", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := iceFragment(tc.frag)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadFragment)) {
				t.Fatalf("iceFragment = %+v, %v; want ok=%v", c, err, tc.ok)
			}
		})
	}
}

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
	rt := newRestartTable()
	s := &session{t: &Transceiver{m: &metrics{path: newPathMetrics()}}}
	const newUfrag, newPwd = "NEWSERVERUFRAG000000", "newserverpassword0000000"
	a := &iceAlias{session: s, serverPwd: newPwd, client: "newc", orig: iceCreds{"OLDSERVERUFRAG000000", "oldserverpassword000000"}, origClient: "oldclientufrag"}
	a.username = a.orig.ufrag + ":" + a.origClient
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
	if err := stun.NewShortTermIntegrity(a.orig.pwd).Check(got); err != nil {
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
		&stun.XORMappedAddress{IP: []byte{127, 0, 0, 9}, Port: 4000}, stun.NewShortTermIntegrity(a.orig.pwd), stun.Fingerprint)
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
		{"old credentials", check(t, a.username, a.orig.pwd).Raw},
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

// TestRestartICEAPI drives PATCH on the pod's session API: 404 for an
// unknown session, 400 for a fragment without credentials, 412 for a stale
// If-Match, 200 with new credentials (a routing token of this pod), then
// the same fragment again changes nothing.
func TestRestartICEAPI(t *testing.T) {
	p := newPod(t, Config{})
	srv := httptest.NewServer(p.t.Handler())
	defer srv.Close()
	defer http.DefaultClient.CloseIdleConnections()
	offer, _ := json.Marshal(testsdp.Offer(t))
	resp, err := http.Post(srv.URL+SessionsPath, "application/json", strings.NewReader(`{"offer":`+string(offer)+`,"pops":[{"id":1,"vip":"127.0.0.2:3478"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var created sessionapi.CreateResponse
	_ = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	oldUfrag, _ := iceFragment(created.Answer)

	patch := func(id string, req sessionapi.RestartRequest) (int, sessionapi.RestartResponse, string) {
		t.Helper()
		body, _ := json.Marshal(req)
		r, _ := http.NewRequest(http.MethodPatch, srv.URL+SessionsPath+"/"+id, strings.NewReader(string(body)))
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out sessionapi.RestartResponse
		var raw json.RawMessage
		_ = json.NewDecoder(res.Body).Decode(&raw)
		_ = json.Unmarshal(raw, &out)
		return res.StatusCode, out, string(raw)
	}
	frag := "a=ice-ufrag:newc\r\na=ice-pwd:" + clientPwd + "\r\n"
	for _, tc := range []struct {
		name   string
		id     string
		req    sessionapi.RestartRequest
		status int
	}{
		{"unknown session", "nosuchsession", sessionapi.RestartRequest{Fragment: frag}, http.StatusNotFound},
		{"no credentials", created.ID, sessionapi.RestartRequest{Fragment: "a=candidate:1 1 udp 1 127.0.0.1 9 typ host\r\n"}, http.StatusBadRequest},
		{"stale If-Match", created.ID, sessionapi.RestartRequest{Fragment: frag, IfMatch: `"someotherstate"`}, http.StatusPreconditionFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if status, _, body := patch(tc.id, tc.req); status != tc.status {
				t.Fatalf("PATCH = %d %s, want %d", status, body, tc.status)
			}
		})
	}
	status, out, body := patch(created.ID, sessionapi.RestartRequest{Fragment: frag, IfMatch: etag(oldUfrag.ufrag)})
	if status != http.StatusOK || !out.Restarted {
		t.Fatalf("restart: %d %s", status, body)
	}
	c, err := iceFragment(out.Fragment)
	if err != nil || c.ufrag == oldUfrag.ufrag || out.ETag != etag(c.ufrag) || !strings.Contains(out.Fragment, "a=ice-lite") {
		t.Fatalf("restart answer %+v (%v): want new credentials, ice-lite and the new ETag", out, err)
	}
	tok, err := p.t.cfg.Keys.Verify([]byte(c.ufrag))
	if err != nil || tok.Cluster != p.t.cfg.Cluster || tok.Pod != p.t.cfg.Pod {
		t.Fatalf("new ufrag is not a token of this pod: %+v, %v", tok, err)
	}
	if status, again, _ := patch(created.ID, sessionapi.RestartRequest{Fragment: frag, IfMatch: "*"}); status != http.StatusOK || again.Restarted || again.ETag != out.ETag {
		t.Fatalf("same credentials again: %d %+v, want no restart and the same ETag", status, again)
	}
	if n := p.counter(t, "rtcedge_transceiver_ice_restarts_total", "result", "ok"); n != 1 {
		t.Errorf("ice_restarts_total{result=ok} = %v, want 1", n)
	}
	if n := p.t.Sessions(); n != 1 {
		t.Errorf("%d sessions, want the one restarted", n)
	}
}

// restartHotPath is the table with one restarted session and two datagrams
// the pod sees all the time: SRTP, and a check of another session.
func restartHotPath(t testing.TB) (*restartTable, []byte, []byte) {
	rt := newRestartTable()
	s := &session{t: &Transceiver{m: &metrics{path: newPathMetrics()}}}
	rt.set("NEWSERVERUFRAG000000", &iceAlias{session: s, serverPwd: "newserverpassword0000000", client: "newc"})
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

// TestRestartAfterEndLeavesNothing: an ICE restart that found its session
// just before the session ended registers nothing (its alias and routing
// token would outlive the session, each holding it, for good).
func TestRestartAfterEndLeavesNothing(t *testing.T) {
	p := newPod(t, Config{})
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: testsdp.Offer(t), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	p.t.mu.Lock()
	s := p.t.sessions[res.ID]
	p.t.mu.Unlock()
	if err := p.t.EndSession(res.ID); err != nil {
		t.Fatal(err)
	}
	ufrag, err := p.t.cfg.Keys.Mint(p.t.cfg.Cluster, p.t.cfg.Pod)
	if err != nil {
		t.Fatal(err)
	}
	if p.t.addRestart(s, ufrag, &iceAlias{session: s}) {
		t.Error("a restart of an ended session was registered")
	}
	if n := p.t.restarts.active.Load(); n != 0 {
		t.Errorf("%d restart aliases after the session ended", n)
	}
	tok, err := p.t.cfg.Keys.Verify([]byte(ufrag))
	if err != nil {
		t.Fatal(err)
	}
	if p.t.byNonce.get(tok.Nonce) != nil {
		t.Error("the restart's routing token still finds the ended session")
	}
}
