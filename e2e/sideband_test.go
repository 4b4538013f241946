package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// Two API keys of one tenant: the app's (e2eAPIKey), which mints the
// caller's client secret, and another, which may hang the call up (same
// tenant) but must not attach to its sideband.
const (
	sidebandAppKey   = e2eAPIKey
	sidebandOtherKey = "sk-sideband-other-012345678"
)

// sidebandConn is an app server's sideband: every event it receives, raw.
type sidebandConn struct {
	conn *websocket.Conn

	mu      sync.Mutex
	events  [][]byte // guarded by mu
	err     error    // guarded by mu: why reading ended
	changed chan struct{}
	done    chan struct{}
}

// attachSideband opens GET /v1/realtime?call_id= at signaling as a
// WebSocket; a refusal returns its status and body instead.
func attachSideband(ctx context.Context, t *testing.T, signalingURL, callID, bearer string) (*sidebandConn, int, []byte) {
	t.Helper()
	hdr := http.Header{}
	if bearer != "" {
		hdr.Set("Authorization", "Bearer "+bearer)
	}
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	conn, resp, err := websocket.Dial(ctx, strings.Replace(signalingURL, "http", "ws", 1)+"/v1/realtime?call_id="+callID,
		&websocket.DialOptions{HTTPHeader: hdr, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		if resp == nil {
			t.Fatalf("attach: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, resp.StatusCode, body
	}
	conn.SetReadLimit(sessionapi.MaxSidebandMessage)
	sb := &sidebandConn{conn: conn, changed: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(sb.done)
		for {
			_, data, err := conn.Read(context.Background())
			sb.mu.Lock()
			if err != nil {
				sb.err = err
			} else {
				sb.events = append(sb.events, data)
			}
			sb.mu.Unlock()
			select {
			case sb.changed <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { _ = conn.CloseNow(); <-sb.done })
	return sb, http.StatusSwitchingProtocols, nil
}

func (sb *sidebandConn) send(t *testing.T, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := sb.conn.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// await waits until cond holds over the events received.
func (sb *sidebandConn) await(t *testing.T, d time.Duration, what string, cond func(events [][]byte, err error) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		sb.mu.Lock()
		ok := cond(sb.events, sb.err)
		sb.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-sb.changed:
		case <-deadline.C:
			sb.mu.Lock()
			defer sb.mu.Unlock()
			t.Fatalf("after %v: no %s (sideband has %d events: %v, err %v)", d, what, len(sb.events), eventTypes(sb.events), sb.err)
		}
	}
}

func eventTypes(evs [][]byte) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		var v struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(e, &v)
		out[i] = v.Type
	}
	return out
}

// findEvent returns the last event of type typ, decoded.
func findEvent(evs [][]byte, typ string) map[string]any {
	for i := len(evs) - 1; i >= 0; i-- {
		var m map[string]any
		if json.Unmarshal(evs[i], &m) == nil && m["type"] == typ {
			return m
		}
	}
	return nil
}

// TestSidebandThroughRelays: an app server mints a client secret with its
// API key; a Pion caller places the call with it, through both relay tiers
// to a pod whose backend is the Realtime reference server, over TLS
// session APIs. The app attaches to the call's sideband with its key:
//   - it sees every event the caller sees, byte for byte and in the same
//     order, from session.created on (the replay covers the events before
//     it attached);
//   - its session.update (instructions, tools) reaches the server
//     unfiltered — a caller could not set them — and its tool round trip
//     (the server calls the tool on the caller's turn; the app sends the
//     function_call_output and response.create) ends in an audio reply the
//     caller hears; none of the app's events reaches the caller;
//   - every other credential learns nothing: another key of the same
//     tenant, an unknown call, the ended call all get the same 404 and
//     body; a client secret (even the caller's) the same 401 for a live
//     and an unknown call; the pod's and the front's session APIs refuse
//     a WebSocket without the cluster's secret;
//   - hanging up closes the sideband with the pod's "call ended" status,
//     passed through both fronts.
func TestSidebandThroughRelays(t *testing.T) {
	srv := startRefServer(t, refserver.Config{})
	w := startWorld(t, devworld.Config{BackendURL: srv.URL() + "?model=ref", APIKeys: []string{sidebandAppKey, sidebandOtherKey}, SessionAPITLS: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	plain := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer plain.CloseIdleConnections()
	secret := mintSecretWith(t, plain, w.SignalingURL, `{"instructions":"app rules"}`).Value
	call := dialVoiceAs(ctx, t, w.SignalingURL, secret)
	callID := path.Base(call.location)
	sess, err := srv.NextSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, status, body := attachSideband(ctx, t, w.SignalingURL, callID, sidebandAppKey)
	if sb == nil {
		t.Fatalf("attach with the app's key: %d %s", status, body)
	}
	sb.await(t, 10*time.Second, "session.created (replayed)", func(evs [][]byte, _ error) bool {
		return len(evs) > 0 && eventTypes(evs)[0] == "session.created"
	})

	// The app's session.update: instructions and a tool, which the
	// caller's client secret does not allow it.
	sb.send(t, map[string]any{"type": "session.update", "event_id": "sb_update", "session": map[string]any{
		"instructions": "sideband rules",
		"tools":        []any{map[string]any{"type": "function", "name": "lookup", "parameters": map[string]any{"type": "object"}}},
	}})
	if err := sess.Wait(ctx, func(st *refserver.State) bool {
		tools, _ := st.Config["tools"].([]any)
		return st.Config["instructions"] == "sideband rules" && len(tools) == 1
	}); err != nil {
		t.Fatalf("the server never got the sideband's instructions and tools: %v", err)
	}

	// The caller talks; the server calls the tool; the app answers it.
	pcm := audiotest.Tone(48000, 440, 0.3, 1200*time.Millisecond)
	call.talk(t, append(append(make([]int16, 48000/5), pcm...), make([]int16, 48000*9/10)...))
	sb.await(t, 20*time.Second, "the tool call", func(evs [][]byte, _ error) bool {
		return findEvent(evs, "response.function_call_arguments.done") != nil
	})
	sb.mu.Lock()
	fc := findEvent(sb.events, "response.function_call_arguments.done")
	sb.mu.Unlock()
	if fc["name"] != "lookup" {
		t.Fatalf("tool call %v", fc)
	}
	sb.send(t, map[string]any{"type": "conversation.item.create", "event_id": "sb_item", "item": map[string]any{
		"type": "function_call_output", "call_id": fc["call_id"], "output": `{"secret":"tool result"}`}})
	sb.send(t, map[string]any{"type": "response.create", "event_id": "sb_response"})
	var st refserver.State
	if err := sess.Wait(ctx, func(s *refserver.State) bool {
		st = refserver.State{ToolOutputs: slices.Clone(s.ToolOutputs), Responses: slices.Clone(s.Responses)}
		return len(s.ToolOutputs) == 1 && len(s.Responses) == 2 && s.Responses[1].Status == "completed"
	}); err != nil {
		t.Fatalf("tool round trip: outputs %+v, responses %+v: %v", st.ToolOutputs, st.Responses, err)
	}
	if st.ToolOutputs[0].CallID != fc["call_id"] || st.Responses[0].ToolCall != "lookup" || st.Responses[1].ToolCall != "" || st.Responses[1].Samples == 0 {
		t.Fatalf("tool round trip: outputs %+v, responses %+v", st.ToolOutputs, st.Responses)
	}
	replySamples := st.Responses[1].Samples
	call.await(t, 30*time.Second, "the reply after the tool", func(payloads [][]byte, evs []string) bool {
		n := 0
		for _, e := range evs {
			if e == "output_audio_buffer.stopped" {
				n++
			}
		}
		return n >= 1 && len(payloads)*24000/50 >= replySamples*95/100
	})

	// Everything the caller got, the sideband got, in the same order.
	call.mu.Lock()
	callerCount := len(call.raw)
	call.mu.Unlock()
	sb.await(t, 10*time.Second, "as many events as the caller", func(evs [][]byte, _ error) bool { return len(evs) >= callerCount })
	call.mu.Lock()
	caller := slices.Clone(call.raw)
	call.mu.Unlock()
	sb.mu.Lock()
	side := slices.Clone(sb.events)
	sb.mu.Unlock()
	if len(side) < len(caller) {
		t.Fatalf("sideband has %d events, caller %d", len(side), len(caller))
	}
	for i := range caller {
		if !bytes.Equal(caller[i], side[i]) {
			t.Fatalf("event %d differs:\ncaller   %s\nsideband %s\ncaller types   %v\nsideband types %v", i, caller[i], side[i], eventTypes(caller), eventTypes(side))
		}
	}
	t.Logf("sideband and caller saw the same %d events: %v", len(caller), eventTypes(caller))
	for _, e := range caller {
		var m map[string]any
		_ = json.Unmarshal(e, &m)
		id, _ := m["event_id"].(string)
		if strings.HasPrefix(id, "sb_") || m["type"] == "session.update" || m["type"] == "conversation.item.create" || m["type"] == "response.create" {
			t.Errorf("the caller got the sideband's event %s", e)
		}
	}
	if err := sess.Wait(ctx, func(s *refserver.State) bool {
		return slices.Contains(s.Received, "conversation.item.create") && slices.Contains(s.Received, "response.create")
	}); err != nil {
		t.Fatal(err)
	}

	// Nobody else learns anything about the call.
	sessionID, _, _ := strings.Cut(callID, ".")
	unknown := sessionID + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	_, notFound, notFoundBody := attachSideband(ctx, t, w.SignalingURL, callID, sidebandOtherKey)
	if notFound != http.StatusNotFound {
		t.Fatalf("another key of the tenant: %d %s", notFound, notFoundBody)
	}
	for _, tc := range []struct {
		name, id, bearer string
		status           int
		body             []byte
	}{
		{"unknown call", unknown, sidebandAppKey, notFound, notFoundBody},
		{"garbage call ID", "rtc_nothing", sidebandAppKey, notFound, notFoundBody},
		{"other key, unknown call", unknown, sidebandOtherKey, notFound, notFoundBody},
	} {
		if _, st, b := attachSideband(ctx, t, w.SignalingURL, tc.id, tc.bearer); st != tc.status || !bytes.Equal(b, tc.body) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, st, b, tc.status, tc.body)
		}
	}
	_, secStatus, secBody := attachSideband(ctx, t, w.SignalingURL, callID, secret)
	if secStatus != http.StatusUnauthorized {
		t.Errorf("the caller's client secret: %d %s", secStatus, secBody)
	}
	if _, st, b := attachSideband(ctx, t, w.SignalingURL, unknown, secret); st != secStatus || !bytes.Equal(b, secBody) {
		t.Errorf("client secret, unknown call: %d %s, want %d %s", st, b, secStatus, secBody)
	}
	_, badStatus, badBody := attachSideband(ctx, t, w.SignalingURL, callID, "sk-not-a-key-00000000000")
	if _, st, b := attachSideband(ctx, t, w.SignalingURL, unknown, "sk-not-a-key-00000000000"); badStatus != http.StatusUnauthorized || st != badStatus || !bytes.Equal(b, badBody) {
		t.Errorf("invalid key: live call %d %s, unknown call %d %s", badStatus, badBody, st, b)
	}

	// The internal session APIs take no WebSocket without the cluster's
	// secret, live session or not.
	insecure := &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer insecure.CloseIdleConnections()
	for _, rg := range w.Regions {
		for _, p := range rg.Pods {
			if _, st, _, err := sessionapi.DialSideband(ctx, insecure, p.API+sessionapi.SidebandPath(sessionID), ""); st != http.StatusUnauthorized {
				t.Errorf("pod %s without the secret: %d %v", p.API, st, err)
			}
		}
		for _, cr := range rg.ClusterRelays {
			if _, st, _, err := sessionapi.DialSideband(ctx, insecure, cr.Front+sessionapi.SidebandPath(sessionID), ""); st != http.StatusUnauthorized {
				t.Errorf("front %s without the secret: %d %v", cr.Front, st, err)
			}
		}
	}

	// Hanging up closes the sideband with the pod's reason; the ended
	// call is as unknown as any.
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, w.SignalingURL+call.location, nil)
	req.Header.Set("Authorization", "Bearer "+sidebandAppKey)
	res, err := plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("hang up: %d", res.StatusCode)
	}
	sb.await(t, 10*time.Second, "the close", func(_ [][]byte, err error) bool { return err != nil })
	sb.mu.Lock()
	closeErr := sb.err
	sb.mu.Unlock()
	if websocket.CloseStatus(closeErr) != sessionapi.CloseCallEnded {
		t.Errorf("sideband closed with %v, want status %d", closeErr, sessionapi.CloseCallEnded)
	}
	if _, st, b := attachSideband(ctx, t, w.SignalingURL, callID, sidebandAppKey); st != notFound || !bytes.Equal(b, notFoundBody) {
		t.Errorf("the ended call, with the app's key: %d %s, want %d %s", st, b, notFound, notFoundBody)
	}

	if n := metricSum(t, w.Registry, "rtcedge_signaling_sideband_attaches_total", map[string]string{"result": "attached"}); n != 1 {
		t.Errorf("signaling counted %v sidebands attached, want 1", n)
	}
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_sideband_events_total", map[string]string{"direction": "to_sideband"}); n < float64(len(caller)) {
		t.Errorf("pod relayed %v events to sidebands, the caller got %d", n, len(caller))
	}
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_sideband_closes_total", map[string]string{"reason": "call_ended"}); n != 1 {
		t.Errorf("pod counted %v sidebands closed with the call, want 1", n)
	}
}

// TestSidebandDevWorld: in the dev world as `rtcedge dev` runs it (no API
// keys: anonymous calls), an anonymous call's sideband attaches without a
// credential, sees the call from session.created on and sets its
// instructions at the server.
func TestSidebandDevWorld(t *testing.T) {
	srv := startRefServer(t, refserver.Config{})
	w := startWorld(t, devworld.Config{BackendURL: srv.URL() + "?model=ref"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := dialVoice(ctx, t, w.SignalingURL)
	sess, err := srv.NextSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, status, body := attachSideband(ctx, t, w.SignalingURL, path.Base(call.location), "")
	if sb == nil {
		t.Fatalf("anonymous attach in the dev world: %d %s", status, body)
	}
	sb.await(t, 10*time.Second, "session.created", func(evs [][]byte, _ error) bool {
		return len(evs) > 0 && eventTypes(evs)[0] == "session.created"
	})
	sb.send(t, map[string]any{"type": "session.update", "session": map[string]any{"instructions": "dev rules"}})
	if err := sess.Wait(ctx, func(st *refserver.State) bool { return st.Config["instructions"] == "dev rules" }); err != nil {
		t.Fatal(err)
	}
}
