package e2e

// OpenAI's own server SDK (the npm package openai) against rtcedge, with
// nothing changed but its base URL: no header removed, no proxy in front.

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/probe"
)

// sdkStepLimit bounds each step of the SDK script (Node starting the SDK
// and a TLS handshake on a loaded machine included).
const sdkStepLimit = 60 * time.Second

// TestOpenAISDKAgainstDev is OpenAI's snippets against `rtcedge dev -tls
// -backend ref` run as a process: the SDK's own key, which the dev world
// never configured, is taken (the banner says so); client_secrets.create
// answers OpenAI's session object; realtime.calls.create (multipart, sdp
// and session) places a call a real Pion caller completes; the sideband
// (OpenAIRealtimeWS({callID}), wss: only, trusting the printed CA through
// NODE_EXTRA_CA_CERTS) sees the call's events and its session.update and
// response.create reach the model; calls.hangup ends the call; errors come
// as OpenAI's classes.
func TestOpenAISDKAgainstDev(t *testing.T) {
	tools := sdk(t)
	bin := proctest.Build(t, "../cmd/rtcedge")
	tlsDir := t.TempDir()
	dev := proctest.Start(t, bin, proctest.Spec{Name: "dev", Args: []string{"dev", "-http", "127.0.0.1:0", "-metrics", "",
		"-pop-port", "0", "-tls", "-tls-dir", tlsDir, "-backend", "ref"}})
	var url, ca string
	anyKey := false
	proctest.Await(t, 60*time.Second, "the dev world's banner", func() bool {
		for _, l := range dev.Lines() {
			if _, u, ok := strings.Cut(l, "signaling + demo page: "); ok {
				url = strings.TrimSpace(u)
			}
			if _, c, ok := strings.Cut(l, "NODE_EXTRA_CA_CERTS="); ok {
				ca = strings.TrimSuffix(strings.TrimSpace(c), ")")
			}
			anyKey = anyKey || strings.Contains(l, "any bearer key is accepted")
		}
		return url != "" && ca != "" && anyKey
	})
	if !strings.HasPrefix(url, "https://127.0.0.1:") || ca != filepath.Join(tlsDir, "ca.pem") {
		t.Fatalf("dev -tls printed URL %s and CA %s, want https and %s", url, ca, filepath.Join(tlsDir, "ca.pem"))
	}
	runServerSDK(t, tools, url, ca, "sk-proj-the-key-of-an-openai-snippet", "")
	if err := dev.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	dev.Wait(t, 20*time.Second)
}

// TestOpenAISDKAgainstRoles is the same against the roles run as separate
// processes as an operator runs them: signaling with an API key from the
// environment and tls in its config, a transceiver whose backend_url is
// the reference server (`rtcedge realtime-ref`), a cluster relay and a
// global relay. A wrong key is refused as OpenAI's AuthenticationError.
func TestOpenAISDKAgainstRoles(t *testing.T) {
	tools := sdk(t)
	bin := proctest.Build(t, "../cmd/rtcedge")
	dir := t.TempDir()
	public, client, err := sessionapi.WriteDevCA(dir, net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	const appKey = "sk-app-0123456789abcdef"
	key, hop, secret := make([]byte, 32), make([]byte, 16), make([]byte, 32)
	_, _ = rand.Read(key)
	_, _ = rand.Read(hop)
	_, _ = rand.Read(secret)
	env := []string{"RTCEDGE_TOKEN_KEYS=1:" + base64.StdEncoding.EncodeToString(key),
		"RTCEDGE_HOP_KEYS=1/1:" + base64.StdEncoding.EncodeToString(hop),
		"RTCEDGE_API_KEYS=" + appKey, "RTCEDGE_CLIENT_SECRET_KEY=" + base64.StdEncoding.EncodeToString(secret)}
	gossip := func(name, join string) string {
		s := "  name: " + name + "\n  bind: 127.0.0.1:0\n  insecure: true\n  fast: true\n"
		if join != "" {
			s += "  join: [" + join + "]\n"
		}
		return s
	}
	role := func(name, config string) *proctest.Proc {
		return proctest.Start(t, bin, proctest.Spec{Name: name, Env: env,
			Args: []string{name, "-config", proctest.WriteFile(t, dir, name+".yaml", config)}})
	}
	ref := proctest.Start(t, bin, proctest.Spec{Name: "realtime-ref", Args: []string{"realtime-ref", "-addr", "127.0.0.1:0"}})
	var backendURL string
	proctest.Await(t, 30*time.Second, "the reference server's URL", func() bool {
		for _, l := range ref.Lines() {
			if _, u, ok := strings.Cut(l, "Realtime reference server at "); ok {
				backendURL, _, _ = strings.Cut(u, " ")
				return true
			}
		}
		return false
	})
	tr := role("transceiver", "region: eu-central\ncluster: 1\npod: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\n"+
		"backend_url: "+backendURL+"\ngossip:\n"+gossip("pod-1", ""))
	trUp := tr.WaitLog(t, "transceiver up", 30*time.Second)
	cr := role("clusterrelay", "region: eu-central\ncluster: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\n"+
		"cluster_gossip:\n"+gossip("cr-1", trUp["gossip"])+"global_gossip:\n"+gossip("cr-1", ""))
	crUp := cr.WaitLog(t, "cluster relay up", 30*time.Second)
	gr := role("globalrelay", "region: eu-central\npop: 1\nclusters: [1]\npublic_addr: 127.0.0.5:0\ninternal_addr: 127.0.0.1\nworkers: 1\n"+
		"drain_timeout: 2s\ngossip:\n"+gossip("gr-1", crUp["global_gossip"]))
	grUp := gr.WaitLog(t, "global relay up", 30*time.Second)
	catalogue := proctest.WriteFile(t, dir, "catalogue.yaml", fmt.Sprintf(
		"default_region: eu-central\nregions:\n  - name: eu-central\n    location: {lat: 50.11, lon: 8.68}\n"+
			"    clusters:\n      - {id: 1, name: eu-central-1, session_api: %q}\n"+
			"    pops:\n      - {id: 1, name: fra, vip: %q}\n", crUp["api"], grUp["public"]))
	sig := role("signaling", "listen_addr: 127.0.0.1:0\ndrain_delay: 200ms\ncatalogue: "+catalogue+"\n"+
		"tls: {cert: "+public.Cert+", key: "+public.Key+"}\ngossip:\n"+gossip("sig-1", crUp["global_gossip"]))
	url := sig.WaitLog(t, "signaling up", 30*time.Second)["url"]
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("signaling with tls serves %s", url)
	}
	hc, err := client.Client(&http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer hc.CloseIdleConnections()
	proctest.Await(t, 30*time.Second, "signaling to see cluster 1 through gossip", func() bool {
		res, err := hc.Get(url + "/v1/regions")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return strings.Contains(string(b), `"known":true`) && strings.Contains(string(b), `"healthy":true`)
	})
	runServerSDK(t, tools, url, client.CA, appKey, "sk-app-not-the-key-0123")
	proctest.StopAll(t, 20*time.Second, sig, gr, cr, tr, ref)
}

// sdkOffers hands a probe's offer to the SDK script instead of posting it,
// and answers with what the SDK's calls.create got: the SDK places the
// call, a real Pion caller completes it.
type sdkOffers struct{ n *nodeScript }

func (o sdkOffers) RoundTrip(req *http.Request) (*http.Response, error) {
	offer, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	o.n.send(map[string]any{"offer": string(offer)})
	ans := o.n.next("answer", sdkStepLimit)
	status, _ := ans["status"].(float64)
	loc, _ := ans["location"].(string)
	sdp, _ := ans["sdp"].(string)
	return &http.Response{StatusCode: int(status), Header: http.Header{"Location": {loc}}, Request: req,
		Body: io.NopCloser(strings.NewReader(sdp))}, nil
}

// runServerSDK runs testdata/sdk/server.mjs against signaling at url with
// key, checking every step (see TestOpenAISDKAgainstDev); wrongKey, when
// set, must be refused.
func runServerSDK(t *testing.T, tools sdkTools, url, ca, key, wrongKey string) {
	t.Helper()
	n := tools.runNode(t, tools.workdir(t, "server.mjs"), "server.mjs",
		"RTCEDGE_BASE="+url+"/v1", "OPENAI_API_KEY="+key, "NODE_EXTRA_CA_CERTS="+ca, "WRONG_KEY="+wrongKey)

	cs := n.next("client_secret", sdkStepLimit)
	sess, _ := cs["session"].(map[string]any)
	if v, _ := cs["value"].(string); !strings.HasPrefix(v, "ek_") || sess == nil ||
		!strings.HasPrefix(fmt.Sprint(sess["id"]), "sess_") || sess["object"] != "realtime.session" || sess["type"] != "realtime" ||
		sess["instructions"] != "SEALED-BY-THE-APP" {
		t.Fatalf("client_secrets.create returned %v, want an ek_ secret and OpenAI's session object with the sealed instructions", cs)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*sdkStepLimit)
	defer cancel()
	call, err := probe.Dial(ctx, probe.Config{SignalingURL: url, Path: "/v1/realtime/calls",
		HTTPClient: &http.Client{Transport: sdkOffers{n}}, Logger: testLogger()})
	if err != nil {
		t.Fatalf("the call calls.create placed did not connect: %v", err)
	}
	defer call.Close()
	if !strings.HasPrefix(call.Location, "/v1/realtime/calls/") {
		t.Fatalf("calls.create's Location %q", call.Location)
	}
	n.send(map[string]any{"connected": true})

	sb := n.next("sideband", sdkStepLimit)
	types := fmt.Sprint(sb["types"])
	t.Logf("sideband %v saw %s", sb["url"], types)
	if u, _ := sb["url"].(string); !strings.HasPrefix(u, "wss://") || !strings.Contains(u, "call_id=") {
		t.Errorf("the sideband dialled %v, want wss:// with call_id", sb["url"])
	}
	for _, want := range []string{"session.created", "session.updated", "response.created", "response.done"} {
		if !slices.Contains(strings.Fields(strings.Trim(types, "[]")), want) {
			t.Errorf("the sideband saw %s, want %s among them", types, want)
		}
	}
	if errs, _ := sb["errors"].([]any); len(errs) > 0 {
		t.Errorf("the sideband reported errors: %v", errs)
	}

	n.next("hangup", sdkStepLimit)
	proctest.Await(t, 20*time.Second, "calls.hangup to end the caller's call", func() bool {
		s := call.ConnectionState()
		return s == webrtc.PeerConnectionStateClosed || s == webrtc.PeerConnectionStateFailed || s == webrtc.PeerConnectionStateDisconnected
	})

	errs := n.next("errors", sdkStepLimit)
	check := func(name, field string) {
		e, _ := errs[name].(map[string]any)
		if e == nil || e[field] != true {
			t.Errorf("%s: got %v, want OpenAI's %s", name, errs[name], field)
		}
	}
	check("hangup_again", "not_found_error")
	check("bad_secret", "authentication_error")
	if wrongKey != "" {
		check("wrong_key", "authentication_error")
	}
	n.next("done", sdkStepLimit)
}
