package transceiver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// TestCallEndedWatch: the SIP front's watch of a phone call's end is held
// until the call ends and answered with the reason; a call the pod no
// longer holds is a 404 session_not_found.
func TestCallEndedWatch(t *testing.T) {
	p := newPod(t, Config{})
	media := netip.MustParseAddrPort("198.51.100.7:40000")
	res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(p.t.Handler())
	defer api.Close()
	url := api.URL + sessionapi.SessionsPath + sessionapi.CallEndedPath(res.ID)
	type answer struct {
		status int
		body   sessionapi.CallEnded
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		var a answer
		a.status, a.err = resp.StatusCode, json.NewDecoder(resp.Body).Decode(&a.body)
		got <- a
	}()
	select {
	case a := <-got:
		t.Fatalf("answered %+v before the call ended", a)
	default:
	}
	c := p.call(t, res.ID)
	eventually(t, "the watch to be held", func() bool {
		c.ended.mu.Lock()
		defer c.ended.mu.Unlock()
		return c.ended.ch != nil
	})
	if err := p.t.EndSession(res.ID); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil || a.status != http.StatusOK || a.body.Reason != endDeleted {
		t.Fatalf("watch answered %+v, want 200 with reason %q", a, endDeleted)
	}
	eventually(t, "the call to be forgotten", func() bool { return p.t.Sessions() == 0 })
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("watch of an ended call: %d, want 404", resp.StatusCode)
	}
}
