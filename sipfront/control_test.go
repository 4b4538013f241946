package sipfront_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"

	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/sipfront"
)

// The Standard Webhooks specification's published test secret.
const (
	hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	appKey     = "sk-app-0123456789abcdef"
	otherKey   = "sk-other-0123456789abcdef"
)

// incoming is the realtime.call.incoming event as an application reads it.
type incoming struct {
	Object    string `json:"object"`
	ID        string `json:"id"`
	Type      string `json:"type"`
	CreatedAt int64  `json:"created_at"`
	Data      struct {
		CallID     string `json:"call_id"`
		SIPHeaders []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"sip_headers"`
	} `json:"data"`
}

// verifyDelivery checks a delivery the way a user's application does,
// with its own code: the three headers, a timestamp within five minutes,
// and one v1 signature equal to HMAC-SHA256 of "id.timestamp.body" under
// the secret's base64 key.
func verifyDelivery(h http.Header, body []byte, secret string, now time.Time) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("a Standard Webhooks header is missing")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return errors.New("timestamp outside the tolerance: a replay")
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		version, b64, _ := strings.Cut(s, ",")
		got, err := base64.StdEncoding.DecodeString(b64)
		if version == "v1" && err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

// hookApp is the user's application: its webhook endpoint verifies every
// delivery and hands the event on; answer decides the webhook's status.
type hookApp struct {
	t      *testing.T
	srv    *httptest.Server
	events chan incoming
	answer func(w http.ResponseWriter, r *http.Request) // nil: 200 at once
}

// next is the next event the application took, within 10 s.
func (a *hookApp) next(t *testing.T) incoming {
	t.Helper()
	select {
	case ev := <-a.events:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook delivery")
		return incoming{}
	}
}

func newHookApp(t *testing.T) *hookApp { return newHookAppAnswering(t, nil) }

// newHookAppAnswering is newHookApp whose endpoint answers with answer
// (set before it serves: the handlers read it unguarded).
func newHookAppAnswering(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *hookApp {
	a := &hookApp{t: t, events: make(chan incoming, 4), answer: answer}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := verifyDelivery(r.Header, body, hookSecret, time.Now()); err != nil {
			t.Errorf("delivery: %v", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev incoming
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("event: %v", err)
		}
		a.events <- ev
		if a.answer != nil {
			a.answer(w, r)
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// controlWorld is a front whose trunk is decided by app's webhook, with
// its call-control API served on loopback.
func controlWorld(t *testing.T, app *hookApp, cfg sipfront.Config) (*world, string) {
	t.Helper()
	cfg.WebhookURL, cfg.WebhookSecret, cfg.WebhookAllowPrivate = app.srv.URL, hookSecret, true
	cfg.APIKeys = []sipfront.APIKey{{Key: appKey, ClientSessionFields: []string{"instructions", "voice"}}, {Key: otherKey, Tenant: "other"}}
	cfg.Trunks = []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.1/32"}, Session: map[string]any{"model": "gpt-realtime"}}}
	w := newWorld(t, cfg)
	api := httptest.NewServer(w.front.API())
	t.Cleanup(api.Close)
	return w, api.URL
}

// control POSTs an action on a call and returns the status and body.
func control(t testing.TB, api, key, callID, action, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, api+"/v1/realtime/calls/"+callID+"/"+action, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// ringing places a call from p and returns its final answer (or error)
// on a channel, with the provisional statuses it saw.
type ringing struct {
	call  *sipgo.DialogClientSession
	provs chan int
	done  chan error
}

func ring(t *testing.T, p *phone, to sip.Uri, headers ...sip.Header) *ringing {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	call, err := p.d(to).Invite(ctx, to, offerSDP("127.0.0.1"), append([]sip.Header{sdpType}, headers...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = call.Close() })
	r := &ringing{call: call, provs: make(chan int, 8), done: make(chan error, 1)}
	go func() {
		r.done <- call.WaitAnswer(ctx, sipgo.AnswerOptions{OnResponse: func(res *sip.Response) error {
			if res.IsProvisional() {
				r.provs <- res.StatusCode
			}
			return nil
		}})
	}()
	return r
}

// answered accepts a ringing call at api and acknowledges the carrier's
// 200, once the front has taken the ACK.
func answered(t *testing.T, w *world, api string, r *ringing, id string) {
	t.Helper()
	if status, body := control(t, api, appKey, id, "accept", `{}`); status != 200 {
		t.Fatalf("accept: %d %s", status, body)
	}
	if err := <-r.done; err != nil {
		t.Fatalf("the carrier's answer: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acks := count(t, w, "ACK", "ok")
	if err := r.call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ACK", func() bool { return count(t, w, "ACK", "ok") == acks+1 })
}

// finalStatus is a refused call's final status.
func finalStatus(t *testing.T, err error) int {
	t.Helper()
	var de *sipgo.ErrDialogResponse
	if !errors.As(err, &de) {
		t.Fatalf("want a final refusal, got %v", err)
	}
	return de.Res.StatusCode
}

func TestWebhookAcceptPlacesTheCallWithItsSession(t *testing.T) {
	app := newHookApp(t)
	w, api := controlWorld(t, app, sipfront.Config{})
	p := newPhone(t)
	r := ring(t, p, w.uri("udp"), sip.NewHeader("X-Customer", "42"), sip.NewHeader("Authorization", `Digest username="x"`))
	var ev incoming
	select {
	case ev = <-app.events:
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook")
	}
	// 180 Ringing while the application decides (a 100 Trying may come
	// before it).
	for got := 0; got != 180; {
		select {
		case got = <-r.provs:
		case <-time.After(10 * time.Second):
			t.Fatal("no 180 Ringing")
		}
		if got != 100 && got != 180 {
			t.Fatalf("provisional %d, want 180 Ringing", got)
		}
	}
	if ev.Object != "event" || ev.Type != "realtime.call.incoming" || !strings.HasPrefix(ev.ID, "evt_") ||
		!strings.HasPrefix(ev.Data.CallID, "rtc_") || time.Since(time.Unix(ev.CreatedAt, 0)).Abs() > time.Minute {
		t.Fatalf("event %+v", ev)
	}
	headers := map[string]string{}
	for _, h := range ev.Data.SIPHeaders {
		headers[h.Name] = h.Value
	}
	if headers["X-Customer"] != "42" || headers["Call-ID"] == "" || !strings.Contains(headers["From"], "tag=") || headers["To"] == "" {
		t.Fatalf("sip_headers %v", ev.Data.SIPHeaders)
	}
	if _, leaked := headers["Authorization"]; leaked {
		t.Fatal("the event carries the INVITE's Authorization header")
	}
	id := ev.Data.CallID
	for _, tc := range []struct {
		key, id, body, want string
		status              int
	}{
		{otherKey, id, `{}`, "call_not_found", 404},                        // another tenant's call looks absent
		{appKey, "rtc_nosuchcall", `{}`, "call_not_found", 404},            // no such call
		{"sk-wrong-0123456789abcdef", id, `{}`, "invalid_api_key", 401},    // not a key
		{appKey, id, `{"model":"gpt-4o"}`, `"param":"session.model"`, 400}, // sealed by the trunk
		{appKey, id, `{"tools":[]}`, `"param":"session.tools"`, 400},       // not open to this key
		{appKey, id, `[1]`, "invalid_session", 400},                        // not an object
		{appKey, id, `{"instructions":"` + strings.Repeat("x", 40<<10) + `"}`, "body_too_large", 413},
	} {
		if status, body := control(t, api, tc.key, tc.id, "accept", tc.body); status != tc.status || !strings.Contains(body, tc.want) {
			t.Fatalf("accept %s with %.40s: %d %s, want %d %s", tc.id, tc.body, status, body, tc.status, tc.want)
		}
	}
	if status, body := control(t, api, appKey, id, "accept", `{"instructions":"Be brief.","voice":"marin"}`); status != 200 {
		t.Fatalf("accept: %d %s", status, body)
	}
	if err := <-r.done; err != nil {
		t.Fatalf("the carrier's answer: %v", err)
	}
	if status, body := control(t, api, appKey, id, "accept", `{}`); status != http.StatusConflict || !strings.Contains(body, "call_state_conflict") {
		t.Fatalf("second accept: %d %s", status, body)
	}
	if status, _ := control(t, api, appKey, id, "reject", `{}`); status != http.StatusConflict {
		t.Fatalf("reject after accept: %d", status)
	}
	creates, _ := w.cluster.record()
	if len(creates) != 1 || string(creates[0].Config) != `{"instructions":"Be brief.","model":"gpt-realtime","voice":"marin"}` {
		t.Fatalf("the pod got %+v", creates)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ACK", func() bool { return count(t, w, "ACK", "ok") == 1 })
	if err := r.call.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every resource freed", func() bool { return w.front.Dialogs() == 0 && w.front.Pending() == 0 })
	if status, _ := control(t, api, appKey, id, "hangup", ``); status != 404 {
		t.Fatalf("hangup of an ended call: %d, want 404", status)
	}
	m := testmetrics.Take(t, w.reg)
	if m["rtcedge_sipfront_webhooks_total,result=delivered"] != 1 || m["rtcedge_sipfront_call_control_total,action=accept,result=ok"] != 1 ||
		m["rtcedge_sipfront_requests_total,method=INVITE,result=answered"] != 1 {
		t.Fatalf("metrics %v", m)
	}
}

func TestRejectGivesTheCarrierItsStatus(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int
	}{{"busy", `{"status_code":486}`, 486}, {"default", ``, 603}} {
		t.Run(tc.name, func(t *testing.T) {
			app := newHookApp(t)
			w, api := controlWorld(t, app, sipfront.Config{})
			r := ring(t, newPhone(t), w.uri("udp"))
			id := (<-app.events).Data.CallID
			for _, bad := range []string{`{"status_code":200}`, `{"status_code":700}`, `{"status_code":"486"}`, `{"status":486}`} {
				if status, body := control(t, api, appKey, id, "reject", bad); status != 400 {
					t.Fatalf("reject %s: %d %s, want 400", bad, status, body)
				}
			}
			if status, body := control(t, api, appKey, id, "reject", tc.body); status != 200 {
				t.Fatalf("reject: %d %s", status, body)
			}
			if got := finalStatus(t, <-r.done); got != tc.want {
				t.Fatalf("the carrier got %d, want %d", got, tc.want)
			}
			waitFor(t, "every resource freed", func() bool { return w.front.Dialogs() == 0 && w.front.Pending() == 0 })
			if creates, _ := w.cluster.record(); len(creates) != 0 {
				t.Fatalf("a rejected call reached a cluster: %+v", creates)
			}
			if got := count(t, w, "INVITE", "declined"); got != 1 {
				t.Fatalf("declined counted %v", got)
			}
		})
	}
}

// TestUnansweredCallIsRefused: a webhook that takes the event and never
// decides, and one that never answers at all, each leave the call refused
// 480 once the accept timeout passes, and nothing behind (the dialog, the
// call_id, the delivery's goroutine: TestMain's goleak).
func TestUnansweredCallIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hang   bool
		cfg    sipfront.Config
		result string
	}{
		{"no decision", false, sipfront.Config{AcceptTimeout: 400 * time.Millisecond}, "no_decision"},
		{"webhook hangs", true, sipfront.Config{AcceptTimeout: 10 * time.Second, WebhookTimeout: 300 * time.Millisecond}, "webhook_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var hang func(http.ResponseWriter, *http.Request)
			if tc.hang {
				hang = func(_ http.ResponseWriter, r *http.Request) {
					select {
					case <-r.Context().Done():
					case <-release:
					}
				}
			}
			app := newHookAppAnswering(t, hang)
			t.Cleanup(func() { close(release) })
			w, api := controlWorld(t, app, tc.cfg)
			r := ring(t, newPhone(t), w.uri("udp"))
			id := (<-app.events).Data.CallID
			if got := finalStatus(t, <-r.done); got != 480 {
				t.Fatalf("the carrier got %d, want 480", got)
			}
			waitFor(t, "every resource freed", func() bool { return w.front.Dialogs() == 0 && w.front.Pending() == 0 })
			if status, _ := control(t, api, appKey, id, "accept", `{}`); status != 404 {
				t.Fatalf("a late accept: %d, want 404", status)
			}
			if got := count(t, w, "INVITE", tc.result); got != 1 {
				t.Fatalf("%s counted %v: %v", tc.result, got, testmetrics.Take(t, w.reg))
			}
		})
	}
}

// TestWebhookReach: a webhook URL on an internal address is refused at
// connect time unless allowed, and a redirect is never followed.
func TestWebhookReach(t *testing.T) {
	t.Run("private address", func(t *testing.T) {
		app := newHookApp(t)
		cfg := sipfront.Config{WebhookURL: app.srv.URL, WebhookSecret: hookSecret, APIKeys: []sipfront.APIKey{{Key: appKey}},
			Trunks: []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.1/32"}}}}
		w2 := newWorld(t, cfg)
		r := ring(t, newPhone(t), w2.uri("udp"))
		if got := finalStatus(t, <-r.done); got != 480 {
			t.Fatalf("the carrier got %d, want 480", got)
		}
		if len(app.events) != 0 {
			t.Fatal("the webhook reached a loopback address")
		}
		if m := testmetrics.Take(t, w2.reg); m["rtcedge_sipfront_webhooks_total,result=address"] != 1 {
			t.Fatalf("metrics %v", m)
		}
	})
	t.Run("redirect", func(t *testing.T) {
		target := newHookApp(t)
		redirect := httptest.NewServer(http.RedirectHandler(target.srv.URL, http.StatusTemporaryRedirect))
		t.Cleanup(redirect.Close)
		cfg := sipfront.Config{WebhookURL: redirect.URL, WebhookSecret: hookSecret, WebhookAllowPrivate: true, APIKeys: []sipfront.APIKey{{Key: appKey}},
			Trunks: []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.1/32"}}}}
		w := newWorld(t, cfg)
		r := ring(t, newPhone(t), w.uri("udp"))
		if got := finalStatus(t, <-r.done); got != 480 {
			t.Fatalf("the carrier got %d, want 480", got)
		}
		if len(target.events) != 0 {
			t.Fatal("the redirect was followed")
		}
		if m := testmetrics.Take(t, w.reg); m["rtcedge_sipfront_webhooks_total,result=refused"] != 1 {
			t.Fatalf("metrics %v", m)
		}
	})
}

// TestReferTransfersTheCall: /refer sends a REFER in the dialog, the
// carrier's 202 answers the API, its NOTIFYs (sipfrag 100, then 200) are
// taken, and the transfer's success ends the call with a BYE from the
// front, freeing everything.
func TestReferTransfersTheCall(t *testing.T) {
	app := newHookApp(t)
	w, api := controlWorld(t, app, sipfront.Config{})
	calls := make(chan *sipgo.DialogClientSession, 1)
	referTo := make(chan string, 1)
	notified := make(chan error, 1)
	byes := make(chan struct{}, 1)
	p := newPhoneServing(t, func(srv *sipgo.Server) {
		srv.OnRefer(func(req *sip.Request, tx sip.ServerTransaction) {
			_ = tx.Respond(sip.NewResponseFromRequest(req, sip.StatusAccepted, "Accepted", nil))
			referTo <- req.GetHeader("Refer-To").Value()
			call := <-calls
			calls <- call
			go func() { notified <- notifyTransfer(call, "SIP/2.0 100 Trying", "SIP/2.0 200 OK") }()
		})
		srv.OnBye(func(req *sip.Request, tx sip.ServerTransaction) {
			_ = tx.Respond(sip.NewResponseFromRequest(req, sip.StatusOK, "OK", nil))
			byes <- struct{}{}
		})
	})
	r := ring(t, p, w.uri("udp"))
	calls <- r.call
	id := (<-app.events).Data.CallID
	if status, body := control(t, api, appKey, id, "refer", `{"target_uri":"sip:desk@example.com"}`); status != http.StatusConflict {
		t.Fatalf("refer of a ringing call: %d %s, want 409", status, body)
	}
	answered(t, w, api, r, id)
	for _, bad := range []string{`{"target_uri":"http://example.com"}`, `{"target_uri":"sip:a@b>\r\nX: y"}`, `{}`, `{"target":"sip:a@b"}`} {
		if status, body := control(t, api, appKey, id, "refer", bad); status != 400 {
			t.Fatalf("refer %s: %d %s, want 400", bad, status, body)
		}
	}
	if status, body := control(t, api, appKey, id, "refer", `{"target_uri":"sip:+15551234567@transfer.example.com"}`); status != 200 {
		t.Fatalf("refer: %d %s", status, body)
	}
	if got := <-referTo; got != "<sip:+15551234567@transfer.example.com>" {
		t.Fatalf("Refer-To %q", got)
	}
	if err := <-notified; err != nil {
		t.Fatalf("NOTIFY: %v", err)
	}
	select {
	case <-byes:
	case <-time.After(10 * time.Second):
		t.Fatal("no BYE after the transfer")
	}
	waitFor(t, "every resource freed", func() bool {
		_, deletes := w.cluster.record()
		return w.front.Dialogs() == 0 && w.front.Pending() == 0 && len(deletes) == 1
	})
	m := testmetrics.Take(t, w.reg)
	if m["rtcedge_sipfront_transfers_total,result=transferred"] != 1 || m["rtcedge_sipfront_requests_total,method=NOTIFY,result=ok"] != 2 {
		t.Fatalf("metrics %v", m)
	}
}

// notifyTransfer sends the carrier's NOTIFYs of a transfer, one per
// sipfrag status line, each to be answered 200.
func notifyTransfer(call *sipgo.DialogClientSession, frags ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, frag := range frags {
		req := sip.NewRequest(sip.NOTIFY, call.InviteResponse.Contact().Address)
		req.AppendHeader(sip.NewHeader("Event", "refer"))
		state := "active;expires=60"
		if i == len(frags)-1 {
			state = "terminated;reason=noresource"
		}
		req.AppendHeader(sip.NewHeader("Subscription-State", state))
		req.AppendHeader(sip.NewHeader("Content-Type", "message/sipfrag;version=2.0"))
		req.SetBody([]byte(frag + "\r\n"))
		res, err := call.Do(ctx, req)
		if err != nil {
			return err
		}
		if res.StatusCode != 200 {
			return errors.New("NOTIFY answered " + strconv.Itoa(res.StatusCode))
		}
	}
	return nil
}

// BenchmarkInviteToAnswer times INVITE → 200 OK over loopback UDP with
// the trunk's session (no webhook) and with a webhook whose application
// accepts at once from its handler, in the same run (the stand-in
// cluster answers creates at once). Each call is acknowledged and hung up
// before the next.
func BenchmarkInviteToAnswer(b *testing.B) {
	for _, hook := range []bool{false, true} {
		name := "no_webhook"
		if hook {
			name = "webhook_accepts_at_once"
		}
		b.Run(name, func(b *testing.B) { benchInvites(b, hook) })
	}
}

func benchInvites(b *testing.B, hook bool) {
	var api atomic.Value // the API URL, set once the front runs
	cfg := sipfront.Config{SourceRate: 1e6, SourceBurst: 1e6}
	var w *world
	if hook {
		app := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			var ev incoming
			if verifyDelivery(r.Header, body, hookSecret, time.Now()) != nil || json.Unmarshal(body, &ev) != nil {
				rw.WriteHeader(http.StatusUnauthorized)
				return
			}
			if status, msg := control(b, api.Load().(string), appKey, ev.Data.CallID, "accept", `{}`); status != 200 {
				b.Errorf("accept: %d %s", status, msg)
			}
		}))
		b.Cleanup(app.Close)
		cfg.WebhookURL, cfg.WebhookSecret, cfg.WebhookAllowPrivate = app.URL, hookSecret, true
		cfg.APIKeys = []sipfront.APIKey{{Key: appKey}}
	}
	cfg.Trunks = []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.1/32"}, CallsPerSecond: 1e6, CallBurst: 1e6, MaxCalls: 1000}}
	w = newWorld(b, cfg)
	apiSrv := httptest.NewServer(w.front.API())
	b.Cleanup(apiSrv.Close)
	api.Store(apiSrv.URL)
	p := newPhone(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ReportAllocs()
	var took []time.Duration
	defer func() { reportQuantiles(b, took) }()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		call, err := p.d(w.uri("udp")).Invite(ctx, w.uri("udp"), offerSDP("127.0.0.1"), sdpType)
		if err != nil {
			b.Fatal(err)
		}
		if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		took = append(took, time.Since(start))
		if err := call.Ack(ctx); err != nil {
			b.Fatal(err)
		}
		if err := call.Bye(ctx); err != nil {
			b.Fatal(err)
		}
		_ = call.Close()
		<-w.cluster.created
		b.StartTimer()
	}
}

// TestAcceptOfACallNoClusterTakes: the accept hears 503 and the carrier
// gets 503 with Retry-After; nothing is left.
func TestAcceptOfACallNoClusterTakes(t *testing.T) {
	app := newHookApp(t)
	w, api := controlWorld(t, app, sipfront.Config{})
	w.cluster.set(http.StatusServiceUnavailable, nil)
	r := ring(t, newPhone(t), w.uri("udp"))
	id := (<-app.events).Data.CallID
	if status, body := control(t, api, appKey, id, "accept", `{"voice":"marin"}`); status != 503 || !strings.Contains(body, "call_not_placed") {
		t.Fatalf("accept: %d %s, want 503", status, body)
	}
	if got := finalStatus(t, <-r.done); got != 503 {
		t.Fatalf("the carrier got %d, want 503", got)
	}
	waitFor(t, "every resource freed", func() bool { return w.front.Dialogs() == 0 && w.front.Pending() == 0 })
}

// TestCloseWhileRinging: a front that stops answers its ringing calls
// 503 at once instead of holding them to the accept timeout.
func TestCloseWhileRinging(t *testing.T) {
	app := newHookApp(t)
	w, _ := controlWorld(t, app, sipfront.Config{AcceptTimeout: time.Minute})
	r := ring(t, newPhone(t), w.uri("udp"))
	<-app.events
	closed := make(chan error, 1)
	go func() { closed <- w.front.Close() }()
	if got := finalStatus(t, <-r.done); got != 503 {
		t.Fatalf("the carrier got %d, want 503", got)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the ringing call")
	}
	if w.front.Dialogs() != 0 || w.front.Pending() != 0 {
		t.Fatalf("%d dialogs, %d call_ids left", w.front.Dialogs(), w.front.Pending())
	}
}

// reportQuantiles reports the median and p90 of per-call times, which
// the mean of a loaded machine hides.
func reportQuantiles(b *testing.B, took []time.Duration) {
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(took[len(took)*9/10].Microseconds())/1000, "ms-p90")
}

// TestAcceptFromTheWebhookHandler: an application that accepts from
// within its webhook handler and then answers 200 (OpenAI's example does)
// has its delivery completed, not cut when the call is answered.
func TestAcceptFromTheWebhookHandler(t *testing.T) {
	accepted := make(chan int, 1)
	apis := make(chan string, 1)
	var app *hookApp
	app = newHookAppAnswering(t, func(rw http.ResponseWriter, r *http.Request) {
		ev := <-app.events
		status, _ := control(t, <-apis, appKey, ev.Data.CallID, "accept", `{}`)
		accepted <- status
		rw.WriteHeader(http.StatusOK)
	})
	w, api := controlWorld(t, app, sipfront.Config{})
	apis <- api
	r := ring(t, newPhone(t), w.uri("udp"))
	if err := <-r.done; err != nil {
		t.Fatalf("the carrier's answer: %v", err)
	}
	if status := <-accepted; status != 200 {
		t.Fatalf("accept: %d", status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.call.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the delivery's end", func() bool {
		m := testmetrics.Take(t, w.reg)
		if m["rtcedge_sipfront_webhooks_total,result=abandoned"] != 0 {
			t.Fatalf("the delivery was cut: %v", m)
		}
		return m["rtcedge_sipfront_webhooks_total,result=delivered"] == 1
	})
}

// TestHangup: /hangup declines a ringing call (603) and ends an answered
// one with a BYE to the carrier and the session's delete.
func TestHangup(t *testing.T) {
	t.Run("ringing", func(t *testing.T) {
		app := newHookApp(t)
		w, api := controlWorld(t, app, sipfront.Config{})
		r := ring(t, newPhone(t), w.uri("udp"))
		id := (<-app.events).Data.CallID
		if status, body := control(t, api, appKey, id, "hangup", ``); status != 200 {
			t.Fatalf("hangup: %d %s", status, body)
		}
		if got := finalStatus(t, <-r.done); got != 603 {
			t.Fatalf("the carrier got %d, want 603", got)
		}
		waitFor(t, "every resource freed", func() bool { return w.front.Dialogs() == 0 && w.front.Pending() == 0 })
	})
	t.Run("answered", func(t *testing.T) {
		app := newHookApp(t)
		w, api := controlWorld(t, app, sipfront.Config{})
		byes := make(chan struct{}, 1)
		p := newPhoneServing(t, func(srv *sipgo.Server) {
			srv.OnBye(func(req *sip.Request, tx sip.ServerTransaction) {
				_ = tx.Respond(sip.NewResponseFromRequest(req, sip.StatusOK, "OK", nil))
				byes <- struct{}{}
			})
		})
		r := ring(t, p, w.uri("udp"))
		id := (<-app.events).Data.CallID
		answered(t, w, api, r, id)
		if status, body := control(t, api, appKey, id, "hangup", ``); status != 200 {
			t.Fatalf("hangup: %d %s", status, body)
		}
		select {
		case <-byes:
		case <-time.After(10 * time.Second):
			t.Fatal("no BYE after /hangup")
		}
		waitFor(t, "every resource freed", func() bool {
			_, deletes := w.cluster.record()
			return w.front.Dialogs() == 0 && w.front.Pending() == 0 && len(deletes) == 1
		})
		if status, _ := control(t, api, appKey, id, "hangup", ``); status != 404 {
			t.Fatalf("a second hangup: %d, want 404", status)
		}
	})
}

// TestNotifyRefusals: a NOTIFY outside a dialog is 481, of another event
// package 489, without a sipfrag status 400; each counted, none ending
// the call.
func TestNotifyRefusals(t *testing.T) {
	app := newHookApp(t)
	w, api := controlWorld(t, app, sipfront.Config{})
	p := newPhone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stray := sip.NewRequest(sip.NOTIFY, w.uri("udp"))
	stray.AppendHeader(sip.NewHeader("Event", "refer"))
	if res, err := p.cli.Do(ctx, stray); err != nil || res.StatusCode != 481 {
		t.Fatalf("a NOTIFY of no dialog: %v %v, want 481", res, err)
	}
	r := ring(t, p, w.uri("udp"))
	id := (<-app.events).Data.CallID
	answered(t, w, api, r, id)
	for _, tc := range []struct {
		event, body string
		want        int
	}{{"presence", "SIP/2.0 200 OK", 489}, {"refer", "hello", 400}} {
		req := sip.NewRequest(sip.NOTIFY, r.call.InviteResponse.Contact().Address)
		req.AppendHeader(sip.NewHeader("Event", tc.event))
		req.AppendHeader(sip.NewHeader("Content-Type", "message/sipfrag"))
		req.SetBody([]byte(tc.body))
		if res, err := r.call.Do(ctx, req); err != nil || res.StatusCode != tc.want {
			t.Fatalf("NOTIFY %s %q: %v %v, want %d", tc.event, tc.body, res, err, tc.want)
		}
	}
	if w.front.Dialogs() != 1 {
		t.Fatal("a refused NOTIFY ended the call")
	}
	waitFor(t, "the refusals counted", func() bool {
		return count(t, w, "NOTIFY", "no_dialog") == 1 && count(t, w, "NOTIFY", "bad_request") == 2
	})
	if err := r.call.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every resource freed", func() bool { return w.front.Dialogs() == 0 && w.front.Pending() == 0 })
}

// TestDecisionForwardedToTheReplicaHoldingTheCall: two front replicas
// serve the same application; a call rung on b is accepted at a, which
// forwards the accept to b (the call_id names b). A call_id naming an
// unknown replica, and a forwarded request for another replica, are 404:
// nothing is forwarded twice.
func TestDecisionForwardedToTheReplicaHoldingTheCall(t *testing.T) {
	app := newHookApp(t)
	// Each API server is started before its front exists (the peers need
	// its URL); its handler is set once the front is built.
	var mu sync.Mutex
	handlers := map[string]http.Handler{}
	apis := map[string]*httptest.Server{}
	for _, name := range []string{"a", "b"} {
		apis[name] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			h := handlers[name]
			mu.Unlock()
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(apis[name].Close)
	}
	worlds := map[string]*world{}
	for name, peer := range map[string]string{"a": "b", "b": "a"} {
		cfg := sipfront.Config{Replica: name, APIPeers: map[string]string{peer: apis[peer].URL},
			WebhookURL: app.srv.URL, WebhookSecret: hookSecret, WebhookAllowPrivate: true, APIKeys: []sipfront.APIKey{{Key: appKey}},
			Trunks: []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.1/32"}}}}
		worlds[name] = newWorld(t, cfg)
		mu.Lock()
		handlers[name] = worlds[name].front.API()
		mu.Unlock()
	}
	r := ring(t, newPhone(t), worlds["b"].uri("udp"))
	id := (<-app.events).Data.CallID
	if !strings.HasPrefix(id, "rtc_b_") {
		t.Fatalf("call_id %q does not name its replica", id)
	}
	for _, bad := range []string{"rtc_c_0123", "rtc_a_0123"} {
		if status, body := control(t, apis["a"].URL, appKey, bad, "accept", `{}`); status != 404 {
			t.Fatalf("accept of %s at a: %d %s, want 404", bad, status, body)
		}
	}
	if status, body := control(t, apis["a"].URL, "sk-wrong-0123456789abcdef", id, "accept", `{}`); status != 401 {
		t.Fatalf("an unauthenticated accept: %d %s, want 401 before any forwarding", status, body)
	}
	req, _ := http.NewRequest(http.MethodPost, apis["a"].URL+"/v1/realtime/calls/"+id+"/accept", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+appKey)
	req.Header.Set("Rtcedge-Forwarded", "x")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 404 {
		t.Fatalf("a forwarded accept for b at a: %v %v, want 404", res, err)
	} else {
		res.Body.Close()
	}
	if status, body := control(t, apis["a"].URL, appKey, id, "accept", `{}`); status != 200 {
		t.Fatalf("accept at a: %d %s", status, body)
	}
	if err := <-r.done; err != nil {
		t.Fatalf("the carrier's answer: %v", err)
	}
	if status, body := control(t, apis["a"].URL, appKey, id, "accept", `{}`); status != 409 {
		t.Fatalf("a second accept through a: %d %s, want b's 409", status, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.call.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every resource freed", func() bool { return worlds["b"].front.Dialogs() == 0 && worlds["b"].front.Pending() == 0 })
	if got := testmetrics.Take(t, worlds["a"].reg)["rtcedge_sipfront_call_control_total,action=accept,result=forwarded"]; got != 2 {
		t.Fatalf("a forwarded %v accepts, want 2", got)
	}
}

// TestWebhookRetried: a webhook answering 503 is tried again with the
// same webhook-id and a fresh signature; the call rings on and is
// accepted. One answering 400 is not tried again: the call is refused.
func TestWebhookRetried(t *testing.T) {
	ids := make(chan string, 4)
	var tries atomic.Int32
	// The first call's first attempt gets 503, its second 200; the second
	// call's gets 400.
	app := newHookAppAnswering(t, func(rw http.ResponseWriter, r *http.Request) {
		switch tries.Add(1) {
		case 1:
			ids <- r.Header.Get("webhook-id")
			rw.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			ids <- r.Header.Get("webhook-id")
		default:
			rw.WriteHeader(http.StatusBadRequest)
		}
	})
	w, api := controlWorld(t, app, sipfront.Config{})
	r := ring(t, newPhone(t), w.uri("udp"))
	first, second := app.next(t), app.next(t)
	if first.ID != second.ID || first.Data.CallID != second.Data.CallID {
		t.Fatalf("the retry carries another event: %+v, %+v", first, second)
	}
	if a, b := <-ids, <-ids; a != b || a == "" {
		t.Fatalf("webhook-ids %q and %q, want one", a, b)
	}
	if status, body := control(t, api, appKey, first.Data.CallID, "accept", `{}`); status != 200 {
		t.Fatalf("accept: %d %s", status, body)
	}
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = r.call.Ack(ctx)
	_ = r.call.Bye(ctx)

	r = ring(t, newPhone(t), w.uri("udp"))
	<-app.events
	if got := finalStatus(t, <-r.done); got != 480 {
		t.Fatalf("the carrier got %d, want 480", got)
	}
	if len(app.events) != 0 {
		t.Fatal("a 400 was tried again")
	}
	waitFor(t, "every resource freed", func() bool { return w.front.Dialogs() == 0 && w.front.Pending() == 0 })
}
