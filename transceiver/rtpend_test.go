package transceiver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

type watchAnswer struct {
	status int
	body   sessionapi.CallEnded
	err    error
}

// watchEnd starts the SIP front's watch of call id's end and returns once
// the pod holds it.
func watchEnd(t *testing.T, p *pod, api *httptest.Server, id string) <-chan watchAnswer {
	t.Helper()
	got := make(chan watchAnswer, 1)
	go func() {
		resp, err := http.Get(api.URL + sessionapi.SessionsPath + sessionapi.CallEndedPath(id))
		if err != nil {
			got <- watchAnswer{err: err}
			return
		}
		defer resp.Body.Close()
		var a watchAnswer
		a.status, a.err = resp.StatusCode, json.NewDecoder(resp.Body).Decode(&a.body)
		got <- a
	}()
	c := p.call(t, id)
	eventually(t, "the watch to be held", func() bool {
		c.ended.mu.Lock()
		defer c.ended.mu.Unlock()
		return c.ended.ch != nil
	})
	select {
	case a := <-got:
		t.Fatalf("answered %+v before the call ended", a)
	default:
	}
	return got
}

// TestCallEndedWatch: the SIP front's watch of a phone call's end is held
// until the call ends and answered with the reason — a DELETE (the hangup
// API), the backend ending the call — and a call the pod no longer holds
// is a 404 session_not_found.
func TestCallEndedWatch(t *testing.T) {
	for _, tc := range []struct {
		reason string
		end    func(p *pod, b *dtmfBackend, id string) error
	}{
		{endDeleted, func(p *pod, _ *dtmfBackend, id string) error { return p.t.EndSession(id) }},
		{endBackend, func(_ *pod, b *dtmfBackend, _ string) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.sink.(backend.Ender).End("the model server went away")
			return nil
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			b := &dtmfBackend{}
			p := newPod(t, Config{Backend: b})
			media := netip.MustParseAddrPort("198.51.100.7:40000")
			res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
			if err != nil {
				t.Fatal(err)
			}
			api := httptest.NewServer(p.t.Handler())
			defer api.Close()
			got := watchEnd(t, p, api, res.ID)
			if err := tc.end(p, b, res.ID); err != nil {
				t.Fatal(err)
			}
			a := <-got
			if a.err != nil || a.status != http.StatusOK || a.body.Reason != tc.reason {
				t.Fatalf("watch answered %+v, want 200 with reason %q", a, tc.reason)
			}
			eventually(t, "the call to be forgotten", func() bool { return p.t.Sessions() == 0 })
			resp, err := http.Get(api.URL + sessionapi.SessionsPath + sessionapi.CallEndedPath(res.ID))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("watch of an ended call: %d, want 404", resp.StatusCode)
			}
		})
	}
}
