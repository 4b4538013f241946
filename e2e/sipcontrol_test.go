package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/sipfront"
)

// TestSIPWebhookAcceptReachesThePod: a phone call through the dev world's
// SIP front with call control. The front rings and POSTs the signed
// realtime.call.incoming event; the application (a server in the test)
// verifies the signature with its own HMAC, accepts with a session
// config, and the real pod's backend (the Realtime reference server)
// runs the call with that config merged under the trunk's. BYE ends it
// with nothing left on the pods or in the front.
func TestSIPWebhookAcceptReachesThePod(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const key = "sk-e2e-sip-app-0123456789"
	srv := startRefServer(t, refserver.Config{})
	var api atomic.Value // the front's API URL, set once the world runs
	accepted := make(chan int, 1)
	app := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mac := hmac.New(sha256.New, mustB64(t, strings.TrimPrefix(secret, "whsec_")))
		mac.Write([]byte(r.Header.Get("webhook-id") + "." + r.Header.Get("webhook-timestamp") + "." + string(body)))
		sig, _ := strings.CutPrefix(r.Header.Get("webhook-signature"), "v1,")
		if !hmac.Equal(mustB64(t, sig), mac.Sum(nil)) {
			t.Errorf("bad signature on %s", body)
			rw.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev struct {
			Type string `json:"type"`
			Data struct {
				CallID string `json:"call_id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil || ev.Type != "realtime.call.incoming" {
			t.Errorf("event %s: %v", body, err)
		}
		req, _ := http.NewRequest(http.MethodPost, api.Load().(string)+"/v1/realtime/calls/"+ev.Data.CallID+"/accept",
			strings.NewReader(`{"instructions":"You are the booking line.","voice":"ash"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		res.Body.Close()
		accepted <- res.StatusCode
	}))
	defer app.Close()
	w := startWorld(t, devworld.Config{SIPAddr: "127.0.0.1:0", PodsPerCluster: 1, RelaysPerCluster: 1,
		BackendURL: srv.URL() + "?model=ref", SIP: func(c *sipfront.NodeConfig) {
			c.APIAddr = "127.0.0.1:0"
			c.WebhookURL, c.WebhookSecret, c.WebhookAllowPrivate = app.URL, secret, true
			c.APIKeys = []sipfront.APIKey{{Key: key, ClientSessionFields: []string{"instructions", "voice"}}}
			c.Trunks[0].Session = map[string]any{"tools": []any{}}
		}})
	api.Store(w.SIPAPIURL)
	to, cli := sipCarrier(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dua := &sipgo.DialogUA{Client: cli, ContactHDR: sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "carrier", Host: "127.0.0.1", Port: 5999}}}
	offer := "v=0\r\no=carrier 1 1 IN IP4 127.0.0.1\r\ns=call\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
	call, err := dua.Invite(ctx, to, []byte(offer), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	defer call.Close()
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatalf("INVITE: %v, want 200 after the accept", err)
	}
	if status := <-accepted; status != http.StatusOK {
		t.Fatalf("accept answered %d", status)
	}
	if err := call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	sess, err := srv.NextSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var config map[string]any
	if err := sess.Wait(ctx, func(st *refserver.State) bool {
		config = st.Config
		return config["instructions"] == "You are the booking line."
	}); err != nil {
		t.Fatalf("the backend's session never took the accept's instructions: %v (config %v)", err, config)
	}
	if out, _ := config["audio"].(map[string]any)["output"].(map[string]any); out["voice"] != "ash" {
		t.Errorf("the accept's voice did not reach the backend: %v", config["audio"])
	}
	if err := call.Bye(ctx); err != nil {
		t.Fatalf("BYE: %v", err)
	}
	eventually(t, 5*time.Second, "the call's session to end", func() bool { return w.Sessions() == 0 })
	eventually(t, 5*time.Second, "the front's dialog and call_id to end", func() bool {
		return w.SIP.Front().Dialogs() == 0 && w.SIP.Front().Pending() == 0
	})
}

// BenchmarkSIPInviteToAnswer times INVITE → 200 OK through the dev world
// to a real pod with the echo backend, without a webhook and with one
// whose application accepts at once from its handler, in the same run
// (docs/sip.md, "Measured"). Each call is acknowledged and hung up, and
// its session gone, before the next.
func BenchmarkSIPInviteToAnswer(b *testing.B) {
	for _, hook := range []bool{false, true} {
		name := "no_webhook"
		if hook {
			name = "webhook_accepts_at_once"
		}
		b.Run(name, func(b *testing.B) { benchSIPInvites(b, hook) })
	}
}

func benchSIPInvites(b *testing.B, hook bool) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const key = "sk-e2e-sip-app-0123456789"
	cfg := devworld.Config{SIPAddr: "127.0.0.1:0", PodsPerCluster: 1, RelaysPerCluster: 1, Logger: testLogger()}
	var api atomic.Value // the front's API URL, set once the world runs
	if hook {
		client := &http.Client{Transport: &http.Transport{Proxy: nil}}
		app := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			var ev struct {
				Data struct {
					CallID string `json:"call_id"`
				} `json:"data"`
			}
			_ = json.NewDecoder(r.Body).Decode(&ev)
			req, _ := http.NewRequest(http.MethodPost, api.Load().(string)+"/v1/realtime/calls/"+ev.Data.CallID+"/accept", strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer "+key)
			if res, err := client.Do(req); err != nil || res.StatusCode != 200 {
				b.Errorf("accept: %v %v", res, err)
			} else {
				res.Body.Close()
			}
		}))
		defer app.Close()
		cfg.SIP = func(c *sipfront.NodeConfig) {
			c.APIAddr = "127.0.0.1:0"
			c.WebhookURL, c.WebhookSecret, c.WebhookAllowPrivate = app.URL, secret, true
			c.APIKeys = []sipfront.APIKey{{Key: key}}
		}
	}
	w, err := devworld.Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	api.Store(w.SIPAPIURL)
	var to sip.Uri
	if err := sip.ParseUri(w.SIPURI, &to); err != nil {
		b.Fatal(err)
	}
	ua, err := sipgo.NewUA(sipgo.WithUserAgent("carrier"))
	if err != nil {
		b.Fatal(err)
	}
	defer ua.Close()
	cli, err := sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"))
	if err != nil {
		b.Fatal(err)
	}
	dua := &sipgo.DialogUA{Client: cli, ContactHDR: sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "carrier", Host: "127.0.0.1", Port: 5999}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var took []time.Duration
	defer func() { reportQuantiles(b, took) }()
	b.ResetTimer()
	for i := range b.N {
		offer := fmt.Sprintf("v=0\r\no=carrier 1 1 IN IP4 127.0.0.1\r\ns=call\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio %d RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n", 20000+2*(i%20000))
		start := time.Now()
		call, err := dua.Invite(ctx, to, []byte(offer), sip.NewHeader("Content-Type", "application/sdp"))
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
		for deadline := time.Now().Add(10 * time.Second); w.Sessions() != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("a call's session did not end")
			}
		}
		b.StartTimer()
	}
}

func mustB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("base64 %q: %v", s, err)
	}
	return b
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
