package transceiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
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
	status, out, body := patch(created.ID, sessionapi.RestartRequest{Fragment: frag, IfMatch: etag(oldUfrag.Ufrag)})
	if status != http.StatusOK || !out.Restarted {
		t.Fatalf("restart: %d %s", status, body)
	}
	c, err := iceFragment(out.Fragment)
	if err != nil || c.Ufrag == oldUfrag.Ufrag || out.ETag != etag(c.Ufrag) || !strings.Contains(out.Fragment, "a=ice-lite") {
		t.Fatalf("restart answer %+v (%v): want new credentials, ice-lite and the new ETag", out, err)
	}
	tok, err := p.t.cfg.Keys.Verify([]byte(c.Ufrag))
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
	if p.t.addRestart(s, ufrag, "", podnet.Creds{}) {
		t.Error("a restart of an ended session was registered")
	}
	if _, _, ok := p.t.sock.Restarted(s); ok {
		t.Error("a restart alias after the session ended")
	}
	tok, err := p.t.cfg.Keys.Verify([]byte(ufrag))
	if err != nil {
		t.Fatal(err)
	}
	if p.t.byNonce.get(tok.Nonce) != nil {
		t.Error("the restart's routing token still finds the ended session")
	}
}

// TestConcurrentRestartsOneWins: PATCHes racing with the same If-Match
// (the session's current ETag) restart ICE once: exactly one gets new
// credentials, the others 412, and the session's current credentials are
// the winner's. The check of If-Match and the restart are one step.
func TestConcurrentRestartsOneWins(t *testing.T) {
	p := newPod(t, Config{})
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: testsdp.Offer(t), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	p.t.mu.Lock()
	s := p.t.sessions[res.ID]
	p.t.mu.Unlock()
	tag := etag(s.ufrag)
	const rounds, racers = 100, 4
	deadline := time.Now().Add(20 * time.Second)
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		type outcome struct {
			frag string
			res  RestartResult
			err  error
		}
		out := make(chan outcome, racers)
		start := make(chan struct{})
		for i := range racers {
			frag := fmt.Sprintf("a=ice-ufrag:r%03dc%d\r\na=ice-pwd:%s\r\n", round, i, clientPwd)
			go func() {
				<-start
				res, err := p.t.RestartICE(res.ID, frag, tag)
				out <- outcome{frag, res, err}
			}()
		}
		close(start)
		var won []outcome
		for range racers {
			o := <-out
			switch {
			case o.err == nil && o.res.Restarted:
				won = append(won, o)
			case errors.Is(o.err, ErrPrecondition):
			default:
				t.Fatalf("round %d: RestartICE = %+v, %v; want a restart or ErrPrecondition", round, o.res, o.err)
			}
		}
		if len(won) != 1 {
			t.Fatalf("round %d: %d of %d PATCHes with If-Match %s restarted ICE, want exactly 1", round, len(won), racers, tag)
		}
		client, _ := iceFragment(won[0].frag)
		server, _ := iceFragment(won[0].res.Fragment)
		ufrag, cur, ok := p.t.sock.Restarted(s)
		if !ok || ufrag != server.Ufrag || cur != client {
			t.Fatalf("round %d: the session's current restart is %q %+v, want the winner's %q %+v", round, ufrag, cur, server.Ufrag, client)
		}
		tag = won[0].res.ETag
	}
}

// TestRestartSameOfferIsWholeCredential: a fragment is "the credentials in
// use" (no restart, 204) only when both its ufrag and its password are;
// a new password under the same ufrag restarts ICE, and the probe
// password is the new one.
func TestRestartSameOfferIsWholeCredential(t *testing.T) {
	p := newPod(t, Config{})
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: testsdp.Offer(t), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	p.t.mu.Lock()
	s := p.t.sessions[res.ID]
	p.t.mu.Unlock()
	frag := func(ufrag, pwd string) string { return "a=ice-ufrag:" + ufrag + "\r\na=ice-pwd:" + pwd + "\r\n" }
	if r, err := p.t.RestartICE(res.ID, frag(s.client.Ufrag, s.client.Pwd), "*"); err != nil || r.Restarted {
		t.Fatalf("the offer's own credentials: %+v, %v; want no restart", r, err)
	}
	const newPwd = "anotherclientpassword000"
	r, err := p.t.RestartICE(res.ID, frag(s.client.Ufrag, newPwd), "*")
	if err != nil || !r.Restarted {
		t.Fatalf("same ufrag, new password: %+v, %v; want an ICE restart", r, err)
	}
	if _, cur, _ := p.t.sock.Restarted(s); cur.Pwd != newPwd {
		t.Fatalf("client password after the restart %q, want %q", cur.Pwd, newPwd)
	}
	if again, err := p.t.RestartICE(res.ID, frag(s.client.Ufrag, newPwd), "*"); err != nil || again.Restarted || again.ETag != r.ETag {
		t.Fatalf("the restarted credentials again: %+v, %v; want no restart and ETag %s", again, err, r.ETag)
	}
	if again, err := p.t.RestartICE(res.ID, frag(s.client.Ufrag, s.client.Pwd), "*"); err != nil || !again.Restarted {
		t.Fatalf("back to the offer's password: %+v, %v; want an ICE restart", again, err)
	}
}
