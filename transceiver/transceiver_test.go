package transceiver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/internal/token"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// loopBackend sends audio back; the echo package cannot be imported here
// (it imports this package).
type loopBackend struct{}

func (loopBackend) Open(_ context.Context, _ backend.SessionInfo, out backend.Sink) (backend.Handler, error) {
	return loopHandler{out}, nil
}

type loopHandler struct{ out backend.Sink }

func (h loopHandler) Audio(p []byte, d time.Duration) { _ = h.out.WriteAudio(p, d) }
func (h loopHandler) Event([]byte)                    {}
func (h loopHandler) Close() error                    { return nil }

type pod struct {
	t    *Transceiver
	reg  *prometheus.Registry
	addr netip.AddrPort
}

// newPod runs a transceiver on a loopback socket until the test ends.
func newPod(t testing.TB, cfg Config) *pod {
	t.Helper()
	keys, err := token.NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{1}, token.KeyLen)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if cfg.Cluster == 0 {
		cfg.Cluster = 7
	}
	if cfg.Backend == nil {
		cfg.Backend = loopBackend{}
	}
	cfg.Pod, cfg.Keys, cfg.Logger, cfg.Registerer = 3, keys, quiet, reg
	if cfg.Hop == nil {
		cfg.Hop = testHop
	}
	tr, err := New(cfg, conn)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &pod{t: tr, reg: reg, addr: conn.LocalAddr().(*net.UDPAddr).AddrPort()}
}

func (p *pod) counter(t testing.TB, name, label, value string) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
			if label == "" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var popA = POPAddr{ID: 1, VIP: netip.MustParseAddrPort("127.0.0.2:3478")}
var popB = POPAddr{ID: 2, VIP: netip.MustParseAddrPort("127.0.0.3:3478")}

func TestShapeAnswer(t *testing.T) {
	sdp := "v=0\r\n" +
		"a=candidate:1 1 udp 2130706431 127.0.0.2 3478 typ host\r\n" +
		"a=candidate:2 1 udp 2130706431 127.0.0.3 3478 typ host\r\n"
	out, err := shapeAnswer(sdp, []POPAddr{popA, popB})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"a=candidate:1 1 udp 2130706431 127.0.0.2 3478 typ host",
		"a=candidate:2 1 udp 1442840575 127.0.0.3 3478 typ host",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("shaped answer lacks %q:\n%s", want, out)
		}
	}
	if _, err := shapeAnswer(sdp, []POPAddr{popA}); err == nil {
		t.Error("a candidate that is not a requested VIP was accepted")
	}
	if _, err := shapeAnswer("v=0\r\n", []POPAddr{popA}); err == nil {
		t.Error("an answer without candidates was accepted")
	}
}

// TestShapeAnswerTCP: passive TCP candidates (one per POP with a TCP
// port) get their rank's TCP priority: the nearest POP's below its UDP
// candidate, a backup's below every backup's UDP one; a TCP candidate that
// is not a requested POP's TCP address is refused.
func TestShapeAnswerTCP(t *testing.T) {
	a, b := popA, popB
	a.TCPPort, b.TCPPort = 443, 8443
	sdp := "v=0\r\n" +
		"a=candidate:1 1 udp 2130706431 127.0.0.2 3478 typ host\r\n" +
		"a=candidate:2 1 udp 2130706431 127.0.0.3 3478 typ host\r\n" +
		"a=candidate:3 1 tcp 2128609279 127.0.0.2 443 typ host tcptype passive\r\n" +
		"a=candidate:4 1 tcp 2128609279 127.0.0.3 8443 typ host tcptype passive\r\n"
	out, err := shapeAnswer(sdp, []POPAddr{a, b})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"a=candidate:2 1 udp 1442840575 127.0.0.3 3478 typ host",
		"a=candidate:3 1 tcp 2130444287 127.0.0.2 443 typ host tcptype passive",
		"a=candidate:4 1 tcp 1442578431 127.0.0.3 8443 typ host tcptype passive",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("shaped answer lacks %q:\n%s", want, out)
		}
	}
	if _, err := shapeAnswer(sdp, []POPAddr{popA, popB}); err == nil {
		t.Error("a TCP candidate of a POP without a TCP port was accepted")
	}
}

// TestCreateSessionRefusals: every refusal frees its slot and says why.
func TestCreateSessionRefusals(t *testing.T) {
	p := newPod(t, Config{MaxSessions: 1})
	ctx := context.Background()
	offer := testsdp.Offer(t)
	for _, tc := range []struct {
		name string
		req  CreateRequest
		want error
	}{
		{"not SDP", CreateRequest{Offer: "hello", POPs: []POPAddr{popA}}, ErrBadOffer},
		{"no POPs", CreateRequest{Offer: offer}, ErrBadPOP},
		{"POP 0", CreateRequest{Offer: offer, POPs: []POPAddr{{ID: 0, VIP: popA.VIP}}}, ErrBadPOP},
		{"repeated POP", CreateRequest{Offer: offer, POPs: []POPAddr{popA, popA}}, ErrBadPOP},
		{"unspecified VIP", CreateRequest{Offer: offer, POPs: []POPAddr{{ID: 5, VIP: netip.MustParseAddrPort("0.0.0.0:3478")}}}, ErrBadPOP},
		{"too many POPs", CreateRequest{Offer: offer, POPs: []POPAddr{popA, popB, {ID: 3, VIP: netip.MustParseAddrPort("127.0.0.4:1")}, {ID: 4, VIP: netip.MustParseAddrPort("127.0.0.5:1")}, {ID: 6, VIP: netip.MustParseAddrPort("127.0.0.6:1")}}}, ErrBadPOP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := p.t.CreateSession(ctx, tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("CreateSession = %v, want %v", err, tc.want)
			}
			if n := p.t.Sessions(); n != 0 {
				t.Fatalf("%d sessions held after a refusal", n)
			}
		})
	}
	res, err := p.t.CreateSession(ctx, CreateRequest{Offer: offer, POPs: []POPAddr{popA, popB}})
	if err != nil {
		t.Fatalf("good offer refused: %v", err)
	}
	if !strings.Contains(res.Answer, "a=ice-lite") || !strings.Contains(res.Answer, "a=msid:rtcedge audio") {
		t.Errorf("answer lacks a=ice-lite or the msid browsers need:\n%s", res.Answer)
	}
	// A POP ID already bound to another VIP is refused.
	if _, err := p.t.CreateSession(ctx, CreateRequest{Offer: offer, POPs: []POPAddr{{ID: 1, VIP: popB.VIP}}}); !errors.Is(err, ErrBadPOP) && !errors.Is(err, ErrFull) {
		t.Errorf("conflicting POP VIP: %v", err)
	}
	if _, err := p.t.CreateSession(ctx, CreateRequest{Offer: offer, POPs: []POPAddr{popA}}); !errors.Is(err, ErrFull) {
		t.Errorf("second session on a pod of capacity 1: %v, want ErrFull", err)
	}
	drained := p.t.Drain()
	if _, err := p.t.CreateSession(ctx, CreateRequest{Offer: offer, POPs: []POPAddr{popA}}); !errors.Is(err, ErrDraining) {
		t.Errorf("create while draining: %v, want ErrDraining", err)
	}
	if err := p.t.EndSession(res.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not complete after the last session ended")
	}
	if err := p.t.EndSession(res.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second EndSession = %v, want ErrNotFound", err)
	}
}

// TestConnectTimeoutFreesSession: a session whose client never connects is
// freed after ConnectTimeout.
func TestConnectTimeoutFreesSession(t *testing.T) {
	p := newPod(t, Config{ConnectTimeout: 200 * time.Millisecond})
	if _, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: testsdp.Offer(t), POPs: []POPAddr{popA}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the unconnected session to be freed", func() bool { return p.t.Sessions() == 0 })
	if v := p.counter(t, "rtcedge_transceiver_sessions_ended_total", "reason", endConnectTimeout); v != 1 {
		t.Errorf("ended{connect_timeout} = %v, want 1", v)
	}
}

// TestBackendEndsDuringCreate: a session its backend ended before the
// create finished (netbackend ends it from its own goroutine when the model
// server hangs up right after the hello) must not be registered: nothing
// could end it again, and its slot and the pod's drain were lost for good.
func TestBackendEndsDuringCreate(t *testing.T) {
	p := newPod(t, Config{MaxSessions: 1})
	beforeRegister = func(s *session) { s.End("refused") }
	defer func() { beforeRegister = nil }()
	_, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: testsdp.Offer(t), POPs: []POPAddr{popA}})
	if !errors.Is(err, ErrBackendEnded) {
		t.Fatalf("create with a backend that hung up: %v, want ErrBackendEnded", err)
	}
	if n := p.t.Sessions(); n != 0 {
		t.Fatalf("%d sessions held after the backend ended the only one", n)
	}
	select {
	case <-p.t.Drain():
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not complete")
	}
}

// TestPodSocketDrops: datagrams that are not for this pod, or not toward
// it, are dropped and counted by reason; none is answered.
func TestPodSocketDrops(t *testing.T) {
	p := newPod(t, Config{})
	// Bind POP 1 by creating (and ending) a session on it.
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: testsdp.Offer(t), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.t.EndSession(res.ID)
	relay, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	client := netip.MustParseAddrPort("198.51.100.1:5000")
	ingress := netip.MustParseAddrPort("127.0.0.1:9")
	pkt := func(h encap.Header, payload string) []byte { return sealed(t, h, payload) }
	good := encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: client, Ingress: ingress}
	for _, tc := range []struct {
		name   string
		pkt    []byte
		reason string
	}{
		{"garbage", []byte("garbage"), "encap_magic"},
		{"to-client direction", pkt(encap.Header{ToClient: true, Cluster: 7, Pod: 3, POP: 1, Client: client, Ingress: ingress}, "x"), "wrong_direction"},
		{"other pod", pkt(encap.Header{Cluster: 7, Pod: 4, POP: 1, Client: client, Ingress: ingress}, "x"), "wrong_pod"},
		{"other cluster", pkt(encap.Header{Cluster: 8, Pod: 3, POP: 1, Client: client, Ingress: ingress}, "x"), "wrong_pod"},
		{"unknown POP", pkt(encap.Header{Cluster: 7, Pod: 3, POP: 9, Client: client, Ingress: ingress}, "x"), "unknown_pop"},
		{"empty payload", pkt(good, ""), "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := p.counter(t, "rtcedge_transceiver_dropped_packets_total", "reason", tc.reason)
			if _, err := relay.WriteToUDPAddrPort(tc.pkt, p.addr); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the drop to be counted", func() bool {
				return p.counter(t, "rtcedge_transceiver_dropped_packets_total", "reason", tc.reason) == before+1
			})
		})
	}
	// Nothing was answered: the relay socket has nothing to read.
	_ = relay.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _, err := relay.ReadFromUDPAddrPort(make([]byte, 1500)); err == nil {
		t.Errorf("the pod answered a bad datagram (%d bytes)", n)
	}
}

// TestSessionAPI: the internal HTTP API's errors are JSON with the right
// status, and a refused request allocates nothing.
func TestSessionAPI(t *testing.T) {
	p := newPod(t, Config{})
	srv := httptest.NewServer(p.t.Handler())
	defer srv.Close()
	post := func(body string) (*http.Response, map[string]any) {
		resp, err := http.Post(srv.URL+SessionsPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp, out
	}
	offer, _ := json.Marshal(testsdp.Offer(t))
	for _, tc := range []struct {
		name   string
		body   string
		status int
		code   string
	}{
		{"not JSON", "{", http.StatusBadRequest, "invalid_json"},
		{"unknown field", `{"offer":"x","pop":[]}`, http.StatusBadRequest, "invalid_json"},
		{"bad offer", `{"offer":"v=0","pops":[{"id":1,"vip":"127.0.0.2:3478"}]}`, http.StatusBadRequest, "invalid_sdp"},
		{"no POPs", `{"offer":` + string(offer) + `,"pops":[]}`, http.StatusBadRequest, "invalid_pops"},
		// A phone call (docs/sip.md) until pods terminate RTP: refused as
		// an offer, so the SIP front answers 488 at once.
		{"RTP kind, bad offer", `{"kind":"rtp","offer":"v=0","pops":[{"id":1,"vip":"127.0.0.2:3478"}]}`, http.StatusBadRequest, sdpcheck.CodeInvalidSDP},
		{"unknown kind", `{"kind":"fax","offer":` + string(offer) + `,"pops":[{"id":1,"vip":"127.0.0.2:3478"}]}`, http.StatusBadRequest, sessionapi.CodeUnsupportedKind},
		{"too large", `{"offer":"` + strings.Repeat("a", sessionapi.MaxRequestBody) + `"}`, http.StatusRequestEntityTooLarge, "body_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, out := post(tc.body)
			errObj, _ := out["error"].(map[string]any)
			if resp.StatusCode != tc.status || errObj["code"] != tc.code {
				t.Fatalf("got %d %v, want %d %q", resp.StatusCode, out, tc.status, tc.code)
			}
		})
	}
	if n := p.t.Sessions(); n != 0 {
		t.Fatalf("%d sessions after refused requests", n)
	}
	resp, out := post(`{"offer":` + string(offer) + `,"pops":[{"id":1,"vip":"127.0.0.2:3478"}]}`)
	if resp.StatusCode != http.StatusCreated || out["id"] == "" || out["answer"] == "" {
		t.Fatalf("create: %d %v", resp.StatusCode, out)
	}
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+SessionsPath+"/"+out["id"].(string), nil)
	dresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	dresp.Body.Close()
	if dresp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE = %d, want 204", dresp.StatusCode)
	}
	dresp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	dresp.Body.Close()
	if dresp.StatusCode != http.StatusNotFound {
		t.Errorf("second DELETE = %d, want 404", dresp.StatusCode)
	}
	p.t.Drain()
	if resp, _ := post(`{"offer":` + string(offer) + `,"pops":[{"id":1,"vip":"127.0.0.2:3478"}]}`); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("create while draining: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	rz, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	rz.Body.Close()
	if rz.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz while draining = %d, want 503", rz.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestOtherMediaRejected: a video section in the offer is answered with
// port 0 and left out of the BUNDLE group; the audio section is accepted.
func TestOtherMediaRejected(t *testing.T) {
	p := newPod(t, Config{})
	offer := testsdp.Offer(t, webrtc.RTPCodecTypeVideo)
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: offer, POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	var videoMid, section string
	for _, l := range strings.Split(offer, "\r\n") {
		if strings.HasPrefix(l, "m=") {
			section = l
		} else if strings.HasPrefix(l, "a=mid:") && strings.HasPrefix(section, "m=video ") {
			videoMid = strings.TrimPrefix(l, "a=mid:")
		}
	}
	var audio, video, group string
	for _, l := range strings.Split(res.Answer, "\r\n") {
		switch {
		case strings.HasPrefix(l, "m=audio "):
			audio = l
		case strings.HasPrefix(l, "m=video "):
			video = l
		case strings.HasPrefix(l, "a=group:BUNDLE"):
			group = l
		}
	}
	if !strings.HasPrefix(audio, "m=audio 9 ") || !strings.HasPrefix(video, "m=video 0 ") {
		t.Errorf("answer: audio %q, video %q; want audio accepted and video rejected with port 0", audio, video)
	}
	if videoMid == "" || group == "" || slices.Contains(strings.Fields(group)[1:], videoMid) {
		t.Errorf("the rejected section (mid %q) is still bundled: %q\n%s", videoMid, group, res.Answer)
	}
}

// TestUnknownRelayDropped: with a relay set, datagrams from other senders
// are dropped before their header can set a return route.
func TestUnknownRelayDropped(t *testing.T) {
	relays := &RelaySet{}
	relays.Set([]netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")})
	p := newPod(t, Config{Relays: relays})
	stranger, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	h := encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: netip.MustParseAddrPort("198.51.100.1:5000"), Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	if _, err := stranger.WriteToUDPAddrPort(sealed(t, h, "x"), p.addr); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the drop to be counted", func() bool {
		return p.counter(t, "rtcedge_transceiver_dropped_packets_total", "reason", "unknown_relay") == 1
	})
	if (&RelaySet{}).Trusted(netip.MustParseAddrPort("127.0.0.1:1")) != true {
		t.Error("an empty relay set (gossip not joined yet) must trust everyone")
	}
}

// TestLimitOpusRate: every Opus payload type of an answer gets
// maxplaybackrate (replacing one it had; an fmtp line made for one without),
// other codecs and a 48 kHz backend change nothing.
func TestLimitOpusRate(t *testing.T) {
	sdp := "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 109 0\r\n" +
		"a=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10;maxplaybackrate=48000;useinbandfec=1\r\n" +
		"a=rtpmap:109 OPUS/48000/2\r\n" +
		"a=rtpmap:0 PCMU/8000\r\na=fmtp:0 x=1\r\n"
	out := limitOpusRate(sdp, 24000)
	for _, want := range []string{
		"a=fmtp:111 minptime=10;useinbandfec=1;maxplaybackrate=24000\r\n",
		"a=rtpmap:109 OPUS/48000/2\r\na=fmtp:109 maxplaybackrate=24000\r\n",
		"a=fmtp:0 x=1\r\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("limited answer lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "maxplaybackrate") != 2 {
		t.Errorf("limited answer:\n%s", out)
	}
	if limitOpusRate(sdp, 48000) != sdp {
		t.Error("a 48 kHz backend changed the answer")
	}
}

// rateBackend is the echo of a backend that decodes at 16 kHz.
type rateBackend struct{ loopBackend }

func (rateBackend) InputRate() int { return 16000 }

// TestAnswerLimitsOpusRate: a backend that decodes below 48 kHz
// (backend.InputRater) has the answer ask for no audio above its rate; the
// echo's answer asks nothing.
func TestAnswerLimitsOpusRate(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    backend.Backend
		want bool
	}{{"16 kHz", rateBackend{}, true}, {"echo", loopBackend{}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t, Config{Backend: tc.b})
			res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: testsdp.Offer(t), POPs: []POPAddr{popA}})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(res.Answer, ";maxplaybackrate=16000"); got != tc.want {
				t.Errorf("answer asks for maxplaybackrate=16000: %v, want %v:\n%s", got, tc.want, res.Answer)
			}
		})
	}
}
