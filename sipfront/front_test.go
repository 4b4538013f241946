package sipfront_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/placement"
	"github.com/rtcedge/rtcedge/sipfront"
)

// cluster is a cluster's session API as the front sees it: it answers a
// create as the pod will (201, an SDP answer naming the POP) or as told,
// and records every create and delete. The pod's RTP session is not built
// yet (docs/sip.md), so this stands in for the cluster in the front's
// unit tests; the end-to-end test places calls on a real dev world.
type cluster struct {
	t   testing.TB
	srv *httptest.Server

	mu      sync.Mutex
	creates []sessionapi.CreateRequest
	deletes []string
	status  int                    // answer to a create; 0: 201
	hold    chan struct{}          // when set, a create waits for it to close
	created chan string            // receives every created session ID
	ends    map[string]chan string // a call's end for its watch: a reason, or "" for a 404
}

func newCluster(t testing.TB) *cluster {
	c := &cluster{t: t, created: make(chan string, 16)}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *cluster) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == sessionapi.SessionsPath:
		var req sessionapi.CreateRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.creates = append(c.creates, req)
		status, hold := c.status, c.hold
		c.mu.Unlock()
		if hold != nil {
			<-hold
		}
		switch status {
		case 0:
		case http.StatusBadRequest:
			apierr.Write(w, status, apierr.TypeInvalidRequest, sessionapi.CodeUnsupportedKind, "no RTP here", 0)
			return
		default:
			apierr.Write(w, status, apierr.TypeUnavailable, "full", "full", 0)
			return
		}
		id, _ := sessionid.New(1, 7)
		answer := "v=0\r\no=- 1 1 IN IP4 " + req.POPs[0].VIP.Addr().String() + "\r\ns=-\r\nc=IN IP4 " + req.POPs[0].VIP.Addr().String() +
			"\r\nt=0 0\r\nm=audio " + strconv.Itoa(int(req.POPs[0].VIP.Port())) + " RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(sessionapi.CreateResponse{ID: id.String(), Answer: answer, Cluster: 1, Pod: 7})
		c.created <- id.String()
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, sessionapi.SessionsPath+"/") && strings.HasSuffix(r.URL.Path, "/ended"):
		// The pod holds the watch until the call ends (or the front
		// gives up on it).
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, sessionapi.SessionsPath+"/"), "/ended")
		select {
		case reason := <-c.end(id):
			if reason == "" {
				apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(sessionapi.CallEnded{Reason: reason})
		case <-r.Context().Done():
		}
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, sessionapi.SessionsPath+"/"):
		c.mu.Lock()
		c.deletes = append(c.deletes, strings.TrimPrefix(r.URL.Path, sessionapi.SessionsPath+"/"))
		c.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

// end is the channel by which the test ends call id at its pod.
func (c *cluster) end(id string) chan string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ends == nil {
		c.ends = map[string]chan string{}
	}
	if c.ends[id] == nil {
		c.ends[id] = make(chan string, 1)
	}
	return c.ends[id]
}

func (c *cluster) set(status int, hold chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status, c.hold = status, hold
}

func (c *cluster) record() ([]sessionapi.CreateRequest, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sessionapi.CreateRequest(nil), c.creates...), append([]string(nil), c.deletes...)
}

// world is a front serving UDP and TCP on loopback with one cluster.
type world struct {
	front   *sipfront.Front
	cluster *cluster
	reg     *prometheus.Registry
	udp     netip.AddrPort
	tcp     netip.AddrPort
	tls     netip.AddrPort // zero without TLS
}

func catalogue(t testing.TB, api string) *geo.Catalogue {
	t.Helper()
	cat, err := geo.ParseCatalogue([]byte(`default_region: eu
regions:
  - name: eu
    location: {lat: 50, lon: 8}
    clusters: [{id: 1, name: eu-1, session_api: "` + api + `"}]
    pops: [{id: 1, name: eu-pop, vip: "127.0.0.2:3478"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func newWorld(t testing.TB, cfg sipfront.Config) *world { return newWorldTLS(t, cfg, nil) }

// newWorldTLS is newWorld serving SIP over TLS too when tlsConf is set.
func newWorldTLS(t testing.TB, cfg sipfront.Config, tlsConf *tls.Config) *world {
	t.Helper()
	w := &world{cluster: newCluster(t), reg: prometheus.NewRegistry()}
	cat := catalogue(t, w.cluster.srv.URL)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, collectors := placement.NewMetrics("sipfront_test", cat)
	clusters := &placement.Clusters{HTTPClient: w.cluster.srv.Client(), Timeout: 2 * time.Second}
	placer, err := placement.New(placement.Config{Catalogue: cat, Clusters: clusters, MaxAttempts: 2, Logger: log, Now: time.Now, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	_ = collectors
	if cfg.Trunks == nil {
		cfg.Trunks = []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.1/32"},
			Session: map[string]any{"instructions": "Answer the phone."}}}
	}
	w.front, err = sipfront.New(cfg, sipfront.Deps{Placer: placer, Clusters: clusters, Catalogue: cat, Logger: log, Registerer: w.reg})
	if err != nil {
		t.Fatal(err)
	}
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.udp = udp.LocalAddr().(*net.UDPAddr).AddrPort()
	w.tcp = tcp.Addr().(*net.TCPAddr).AddrPort()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ls := sipfront.Listeners{UDP: udp, TCP: tcp}
	if tlsConf != nil {
		tl, err := tls.Listen("tcp4", "127.0.0.1:0", tlsConf)
		if err != nil {
			t.Fatal(err)
		}
		w.tls, ls.TLS = tl.Addr().(*net.TCPAddr).AddrPort(), tl
	}
	go func() { done <- w.front.Serve(ctx, ls) }()
	t.Cleanup(func() {
		if err := w.front.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return w
}

// phone is a SIP user agent placing calls to the front, as a carrier's
// SBC would.
type phone struct {
	ua  *sipgo.UserAgent
	cli *sipgo.Client // UDP, from the phone's listener
	dua *sipgo.DialogUA
	// stream is the DialogUA for TCP and TLS: its connections are the
	// phone's own, closed with the user agent.
	stream *sipgo.DialogUA
	byes   chan *sip.Request // the BYEs the phone got
}

// d is the DialogUA to call u with.
func (p *phone) d(u sip.Uri) *sipgo.DialogUA {
	if u.UriParams != nil && u.UriParams.Has("transport") {
		return p.stream
	}
	return p.dua
}

func newPhone(t testing.TB, opts ...sipgo.UserAgentOption) *phone {
	return newPhoneServing(t, nil, opts...)
}

// newPhoneServing is newPhone whose server takes the requests the front
// sends (BYE, REFER) with the handlers register installs.
func newPhoneServing(t testing.TB, register func(*sipgo.Server), opts ...sipgo.UserAgentOption) *phone {
	t.Helper()
	ua, err := sipgo.NewUA(append([]sipgo.UserAgentOption{sipgo.WithUserAgent("carrier")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	// The phone listens on a UDP socket of its own, which its requests go
	// out from: sipgo v1.7.3 can leave a client-created UDP connection's
	// reader behind (its reference count goes negative), and goleak would
	// see it. A listener is the test's to close.
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sipgo.NewServer(ua)
	if err != nil {
		t.Fatal(err)
	}
	byes := make(chan *sip.Request, 4)
	srv.OnBye(func(req *sip.Request, tx sip.ServerTransaction) {
		_ = tx.Respond(sip.NewResponseFromRequest(req, sip.StatusOK, "OK", nil))
		select {
		case byes <- req:
		default:
		}
	})
	if register != nil {
		register(srv)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.ServeUDP(conn) }()
	// Requests may go out only once the listener is in the transport's
	// pool; before that sipgo would try to bind the address again.
	waitFor(t, "the phone's listener", func() bool {
		c, err := ua.TransportLayer().GetConnection("udp", conn.LocalAddr().String())
		return err == nil && c != nil
	})
	port := conn.LocalAddr().(*net.UDPAddr).Port
	cli, err := sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"), sipgo.WithClientPort(port),
		sipgo.WithClientConnectionAddr(conn.LocalAddr().String()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ua.Close()
		_ = conn.Close()
		<-served
	})
	streamCli, err := sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	contact := sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "carrier", Host: "127.0.0.1", Port: port}}
	return &phone{ua: ua, cli: cli, byes: byes, dua: &sipgo.DialogUA{Client: cli, ContactHDR: contact},
		stream: &sipgo.DialogUA{Client: streamCli, ContactHDR: contact}}
}

func (w *world) uri(transport string) sip.Uri {
	ap := map[string]netip.AddrPort{"udp": w.udp, "tcp": w.tcp, "tls": w.tls}[transport]
	u := sip.Uri{Scheme: "sip", User: "agent", Host: ap.Addr().String(), Port: int(ap.Port())}
	if transport != "udp" {
		u.UriParams = sip.NewParams()
		u.UriParams.Add("transport", transport)
	}
	return u
}

// offerSDP is a carrier's offer: PCMU and PCMA from media.
func offerSDP(media string) []byte {
	return []byte("v=0\r\no=carrier 1 1 IN IP4 " + media + "\r\ns=call\r\nc=IN IP4 " + media +
		"\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0 8 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\na=rtpmap:101 telephone-event/8000\r\n")
}

var sdpType = sip.NewHeader("Content-Type", "application/sdp")

// waitFor polls cond (a state the front reaches on its own goroutines)
// for up to 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func count(t *testing.T, w *world, method, result string) float64 {
	t.Helper()
	return testmetrics.Take(t, w.reg)["rtcedge_sipfront_requests_total,method="+method+",result="+result]
}

func TestCallAnsweredAcknowledgedAndHungUp(t *testing.T) {
	for _, transport := range []string{"udp", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			w := newWorld(t, sipfront.Config{})
			p := newPhone(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			call, err := p.d(w.uri(transport)).Invite(ctx, w.uri(transport), offerSDP("127.0.0.1"), sdpType)
			if err != nil {
				t.Fatal(err)
			}
			if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
				t.Fatalf("answer: %v", err)
			}
			if res := call.InviteResponse; res.StatusCode != 200 || !strings.Contains(string(res.Body()), "m=audio 3478 RTP/AVP 0") {
				t.Fatalf("answer %d:\n%s", res.StatusCode, res.Body())
			}
			if err := call.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			creates, _ := w.cluster.record()
			if len(creates) != 1 || creates[0].Kind != sessionapi.KindRTP || !strings.Contains(creates[0].Offer, "m=audio 40000") ||
				string(creates[0].Config) != `{"instructions":"Answer the phone."}` || len(creates[0].POPs) == 0 {
				t.Fatalf("create: %+v", creates)
			}
			waitFor(t, "the ACK", func() bool {
				if count(t, w, "ACK", "ok") == 1 {
					return true
				}
				if count(t, w, "ACK", "no_dialog") > 0 || count(t, w, "INVITE", "no_ack") > 0 {
					t.Fatalf("the ACK found no dialog: %v", testmetrics.Take(t, w.reg))
				}
				return false
			})
			if n := w.front.Dialogs(); n != 1 {
				t.Fatalf("%d dialogs during the call, want 1", n)
			}
			if err := call.Bye(ctx); err != nil {
				t.Fatalf("BYE: %v", err)
			}
			_ = call.Close()
			session := <-w.cluster.created
			waitFor(t, "the session's delete", func() bool { _, d := w.cluster.record(); return len(d) == 1 })
			if _, deletes := w.cluster.record(); deletes[0] != session {
				t.Fatalf("deleted %q, want %q", deletes[0], session)
			}
			waitFor(t, "the dialog's end", func() bool { return w.front.Dialogs() == 0 })
			if got := count(t, w, "INVITE", "answered"); got != 1 {
				t.Fatalf("INVITE answered counted %v", got)
			}
		})
	}
}

// TestPodEndsCall: the pod ends an answered call on its own (RTP
// timeout; or the call is gone from its pod, a 404): the front hears it
// through its watch of the call's end, sends the carrier BYE, and frees
// the dialog; counted by the pod's reason.
func TestPodEndsCall(t *testing.T) {
	for _, tc := range []struct{ transport, reason, label string }{
		{"udp", "rtp_timeout", "rtp_timeout"},
		{"udp", "", "gone"},
		{"udp", "something new", "other"},
	} {
		t.Run(tc.transport+"/"+tc.label, func(t *testing.T) {
			w := newWorld(t, sipfront.Config{})
			p := newPhone(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			call, err := p.d(w.uri(tc.transport)).Invite(ctx, w.uri(tc.transport), offerSDP("127.0.0.1"), sdpType)
			if err != nil {
				t.Fatal(err)
			}
			defer call.Close()
			if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
				t.Fatalf("answer: %v", err)
			}
			if err := call.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			session := <-w.cluster.created
			waitFor(t, "the dialog", func() bool { return w.front.Dialogs() == 1 })
			w.cluster.end(session) <- tc.reason
			select {
			case bye := <-p.byes:
				if bye.CallID().Value() != call.InviteRequest.CallID().Value() {
					t.Errorf("BYE of call %s, want %s", bye.CallID().Value(), call.InviteRequest.CallID().Value())
				}
			case <-ctx.Done():
				t.Fatal("the carrier got no BYE")
			}
			waitFor(t, "the dialog's end", func() bool { return w.front.Dialogs() == 0 })
			if n := testmetrics.Take(t, w.reg)["rtcedge_sipfront_pod_hangups_total,reason="+tc.label]; n != 1 {
				t.Errorf("pod hangups %q counted %v", tc.label, n)
			}
		})
	}
}

// TestCancelBeforeAnswer cancels while the cluster is placing the call:
// 487, and the session the cluster created meanwhile is deleted.
func TestCancelBeforeAnswer(t *testing.T) {
	w := newWorld(t, sipfront.Config{})
	hold := make(chan struct{})
	w.cluster.set(0, hold)
	p := newPhone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call, err := p.d(w.uri("udp")).Invite(ctx, w.uri("udp"), offerSDP("127.0.0.1"), sdpType)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the create", func() bool { c, _ := w.cluster.record(); return len(c) == 1 })
	cctx, ccancel := context.WithCancel(ctx)
	ccancel() // WaitAnswer with an ended context sends CANCEL
	err = call.WaitAnswer(cctx, sipgo.AnswerOptions{})
	if err == nil {
		t.Fatal("the call was answered after CANCEL")
	}
	close(hold)
	session := <-w.cluster.created
	waitFor(t, "the delete of the session created meanwhile", func() bool { _, d := w.cluster.record(); return len(d) == 1 && d[0] == session })
	waitFor(t, "the dialog's end", func() bool { return w.front.Dialogs() == 0 })
	waitFor(t, "the count", func() bool { return count(t, w, "INVITE", "canceled") == 1 })
	_ = call.Close()
}

// invite sends one INVITE with body and headers over UDP and returns the
// final status.
func invite(t *testing.T, p *phone, to sip.Uri, body []byte, headers ...sip.Header) *sip.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call, err := p.d(to).Invite(ctx, to, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	defer call.Close()
	err = call.WaitAnswer(ctx, sipgo.AnswerOptions{})
	var de *sipgo.ErrDialogResponse
	if err == nil {
		t.Fatalf("answered %d, want a refusal", call.InviteResponse.StatusCode)
	}
	if !errors.As(err, &de) {
		t.Fatalf("no final answer: %v", err)
	}
	return de.Res
}

func TestRefusalsHaveTheirStatus(t *testing.T) {
	w := newWorld(t, sipfront.Config{})
	p := newPhone(t)
	for _, tc := range []struct {
		name    string
		body    []byte
		headers []sip.Header
		cluster int
		status  int
		result  string
	}{
		{"no offer", nil, nil, 0, 488, "no_offer"},
		{"not SDP", []byte("hello"), []sip.Header{sip.NewHeader("Content-Type", "text/plain")}, 0, 415, "unsupported"},
		{"no G.711", []byte(strings.ReplaceAll(string(offerSDP("127.0.0.1")), "RTP/AVP 0 8 101", "RTP/AVP 9")), []sip.Header{sdpType}, 0, 488, "offer_codec"},
		{"media elsewhere", offerSDP("192.0.2.9"), []sip.Header{sdpType}, 0, 488, "offer_address"},
		{"not SDP at all", []byte("v=0\r\nnonsense"), []sip.Header{sdpType}, 0, 488, "offer_syntax"},
		{"pod refuses", offerSDP("127.0.0.1"), []sip.Header{sdpType}, http.StatusBadRequest, 488, "rejected"},
		{"clusters full", offerSDP("127.0.0.1"), []sip.Header{sdpType}, http.StatusServiceUnavailable, 503, "no_capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.cluster.set(tc.cluster, nil)
			res := invite(t, p, w.uri("udp"), tc.body, tc.headers...)
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.status)
			}
			if tc.status == 503 && res.GetHeader("Retry-After") == nil {
				t.Fatal("503 without Retry-After")
			}
			waitFor(t, "the count", func() bool { return count(t, w, "INVITE", tc.result) == 1 })
			if n := w.front.Dialogs(); n != 0 {
				t.Fatalf("%d dialogs left", n)
			}
		})
	}
	if _, deletes := w.cluster.record(); len(deletes) != 0 {
		t.Fatalf("deletes %v for calls never placed", deletes)
	}
}

// TestOutOfDialogAndOtherMethods: requests for no dialog get 481 and
// leave nothing; methods the front does not take get 405 with Allow;
// OPTIONS answers a trunk.
func TestOutOfDialogAndOtherMethods(t *testing.T) {
	w := newWorld(t, sipfront.Config{})
	p := newPhone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		method sip.RequestMethod
		toTag  bool
		status int
	}{
		{sip.BYE, true, 481},
		{sip.CANCEL, false, 481},
		{sip.INVITE, true, 481},
		{sip.REGISTER, false, 405},
		{sip.MESSAGE, false, 405},
		{sip.OPTIONS, false, 200},
	} {
		req := sip.NewRequest(tc.method, w.uri("udp"))
		if tc.toTag {
			to := &sip.ToHeader{Address: w.uri("udp"), Params: sip.NewParams()}
			to.Params.Add("tag", "no-such-dialog")
			req.AppendHeader(to)
		}
		res, err := p.cli.Do(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", tc.method, err)
		}
		if res.StatusCode != tc.status {
			t.Fatalf("%s: %d, want %d", tc.method, res.StatusCode, tc.status)
		}
		if tc.status == 405 && res.GetHeader("Allow") == nil {
			t.Fatalf("%s: 405 without Allow", tc.method)
		}
	}
	if n := w.front.Dialogs(); n != 0 {
		t.Fatalf("%d dialogs left", n)
	}
}

// TestUnknownSourceForbidden: a source outside every trunk is refused
// whatever it sends.
func TestUnknownSourceForbidden(t *testing.T) {
	w := newWorld(t, sipfront.Config{Trunks: []sipfront.Trunk{{Name: "elsewhere", SourceCIDRs: []string{"192.0.2.0/24"}}}})
	p := newPhone(t)
	res := invite(t, p, w.uri("udp"), offerSDP("192.0.2.1"), sdpType)
	if res.StatusCode != 403 {
		t.Fatalf("INVITE from outside the trunks: %d, want 403", res.StatusCode)
	}
	if c, _ := w.cluster.record(); len(c) != 0 {
		t.Fatal("a call from outside the trunks reached a cluster")
	}
}

// TestDigest: a trunk with credentials challenges, takes the right ones
// and refuses wrong ones.
func TestDigest(t *testing.T) {
	w := newWorld(t, sipfront.Config{Trunks: []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.0/8"},
		DigestUser: "trunk", DigestPassword: "s3cret"}}})
	p := newPhone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := invite(t, p, w.uri("udp"), offerSDP("127.0.0.1"), sdpType)
	if res.StatusCode != 401 || res.GetHeader("WWW-Authenticate") == nil {
		t.Fatalf("no credentials: %d, want 401 with a challenge", res.StatusCode)
	}
	call, err := p.d(w.uri("udp")).Invite(ctx, w.uri("udp"), offerSDP("127.0.0.1"), sdpType)
	if err != nil {
		t.Fatal(err)
	}
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{Username: "trunk", Password: "wrong"}); err == nil {
		t.Fatal("wrong password answered")
	}
	_ = call.Close()
	waitFor(t, "the refusal", func() bool { return count(t, w, "INVITE", "forbidden") == 1 })
	call, err = p.d(w.uri("udp")).Invite(ctx, w.uri("udp"), offerSDP("127.0.0.1"), sdpType)
	if err != nil {
		t.Fatal(err)
	}
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{Username: "trunk", Password: "s3cret"}); err != nil {
		t.Fatalf("right password: %v", err)
	}
	if err := call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := call.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	_ = call.Close()
	waitFor(t, "the end", func() bool { return w.front.Dialogs() == 0 })
}

// TestTrunkLimits: past max_calls the trunk's next INVITE gets 503, and
// the call that ends frees its place.
func TestTrunkLimits(t *testing.T) {
	w := newWorld(t, sipfront.Config{Trunks: []sipfront.Trunk{{Name: "carrier", SourceCIDRs: []string{"127.0.0.1/32"}, MaxCalls: 1}}})
	p := newPhone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call, err := p.d(w.uri("udp")).Invite(ctx, w.uri("udp"), offerSDP("127.0.0.1"), sdpType)
	if err != nil {
		t.Fatal(err)
	}
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if res := invite(t, p, w.uri("udp"), offerSDP("127.0.0.1"), sdpType); res.StatusCode != 503 {
		t.Fatalf("second call over max_calls: %d, want 503", res.StatusCode)
	}
	if err := call.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	_ = call.Close()
	waitFor(t, "the end", func() bool { return w.front.Dialogs() == 0 })
	if got := count(t, w, "INVITE", "trunk_full"); got != 1 {
		t.Fatalf("trunk_full counted %v", got)
	}
}

// TestSourceRateDropsUnanswered: past a source's burst, datagrams are
// dropped unanswered and counted; nothing else happens.
func TestSourceRateDropsUnanswered(t *testing.T) {
	w := newWorld(t, sipfront.Config{SourceRate: 1, SourceBurst: 3})
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(w.udp))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const sent = 50
	for i := range sent {
		msg := "OPTIONS sip:agent@" + w.udp.String() + " SIP/2.0\r\nVia: SIP/2.0/UDP " + conn.LocalAddr().String() + ";branch=z9hG4bK-" + strconv.Itoa(i) +
			"\r\nFrom: <sip:scan@127.0.0.1>;tag=1\r\nTo: <sip:agent@127.0.0.1>\r\nCall-ID: scan-" + strconv.Itoa(i) + "\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the drops", func() bool {
		return testmetrics.Take(t, w.reg)["rtcedge_sipfront_dropped_total,reason=source_limit"] >= sent-4
	})
	answered := 0
	buf := make([]byte, 4096)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := conn.Read(buf); err != nil {
			break
		}
		answered++
	}
	if answered > 4 {
		t.Fatalf("%d of %d answered past a burst of 3", answered, sent)
	}
}

// TestMalformedCountedNotAnswered: garbage datagrams are counted and
// leave no state.
func TestMalformedCountedNotAnswered(t *testing.T) {
	w := newWorld(t, sipfront.Config{SourceRate: 1000, SourceBurst: 1000})
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(w.udp))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, junk := range []string{"\x16\x03\x01garbage", "INVITE nonsense\r\n\r\n", "SIP/2.0 200 OK\r\n\r\n", "OPTIONS sip:a SIP/2.0\r\nVia: x\r\n\r\n"} {
		if _, err := conn.Write([]byte(junk)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the malformed count", func() bool {
		return testmetrics.Take(t, w.reg)["rtcedge_sipfront_dropped_total,reason=malformed"] >= 2
	})
	if n := w.front.Dialogs(); n != 0 {
		t.Fatalf("%d dialogs after garbage", n)
	}
}

// TestCallOverTLS: SIP over TLS (5061 in production) with a certificate
// the carrier verifies: answered, acknowledged and hung up.
func TestCallOverTLS(t *testing.T) {
	srvTLS, cliTLS, err := sessionapi.WriteDevCA(t.TempDir(), net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(srvTLS.Cert, srvTLS.Key)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorldTLS(t, sipfront.Config{}, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	roots, err := cliTLS.Client(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := newPhone(t, sipgo.WithUserAgenTLSConfig(roots.Transport.(*http.Transport).TLSClientConfig))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call, err := p.d(w.uri("tls")).Invite(ctx, w.uri("tls"), offerSDP("127.0.0.1"), sdpType)
	if err != nil {
		t.Fatal(err)
	}
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatalf("answer over TLS: %v", err)
	}
	if err := call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ACK", func() bool { return count(t, w, "ACK", "ok") == 1 })
	if err := call.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	_ = call.Close()
	waitFor(t, "the end", func() bool { return w.front.Dialogs() == 0 })
}
