package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"

	"github.com/rtcedge/rtcedge/devworld"
)

// TestSIPInviteReachesAPod places a phone call through the dev world's SIP
// front: trunk admission, the shared placement and the cluster's session
// API front reach a real pod, which answers with its RTP session's SDP
// (the POP's media port, PCMU); the carrier's BYE ends it, with nothing
// left behind anywhere.
func TestSIPInviteReachesAPod(t *testing.T) {
	w := startWorld(t, devworld.Config{SIPAddr: "127.0.0.1:0", PodsPerCluster: 1, RelaysPerCluster: 1})
	if w.SIPURI == "" {
		t.Fatal("the dev world printed no SIP URI")
	}
	to, cli := sipCarrier(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	res, err := cli.Do(ctx, sip.NewRequest(sip.OPTIONS, to))
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("OPTIONS: %v %v", res, err)
	}

	dua := &sipgo.DialogUA{Client: cli, ContactHDR: sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "carrier", Host: "127.0.0.1", Port: 5999}}}
	offer := "v=0\r\no=carrier 1 1 IN IP4 127.0.0.1\r\ns=call\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0 8\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
	call, err := dua.Invite(ctx, to, []byte(offer), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	defer call.Close()
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatalf("INVITE: %v, want 200 with the pod's answer", err)
	}
	if body := string(call.InviteResponse.Body()); !strings.Contains(body, " RTP/AVP 0") || !strings.Contains(body, "a=rtpmap:0 PCMU/8000") {
		t.Fatalf("the answer takes no PCMU:\n%s", body)
	}
	if err := call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if n := w.Sessions(); n != 1 {
		t.Fatalf("%d sessions on the pods during the call, want 1", n)
	}
	if err := call.Bye(ctx); err != nil {
		t.Fatalf("BYE: %v", err)
	}
	eventually(t, 5*time.Second, "the call's session to end", func() bool { return w.Sessions() == 0 })
	if n := w.Sessions(); n != 0 {
		t.Fatalf("%d sessions left on the pods", n)
	}
	eventually(t, 5*time.Second, "the front's dialog to end", func() bool { return w.SIP.Front().Dialogs() == 0 })
}

// sipCarrier is a carrier's SIP client (sipgo) on loopback, the dev trunk,
// and the dev world's URI to call; it is closed when the test ends.
func sipCarrier(t *testing.T, w *devworld.World) (sip.Uri, *sipgo.Client) {
	t.Helper()
	var to sip.Uri
	if err := sip.ParseUri(w.SIPURI, &to); err != nil {
		t.Fatalf("parse %s: %v", w.SIPURI, err)
	}
	ua, err := sipgo.NewUA(sipgo.WithUserAgent("carrier"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ua.Close() })
	cli, err := sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	return to, cli
}
