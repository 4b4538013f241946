package signaling

// The dev world's acceptance of any API key (Config.AnyAPIKey).

import (
	"net/http"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// TestAnyAPIKey: with AnyAPIKey (the dev world) any bearer key that is not
// configured is taken as an anonymous caller's instead of refused, but
// owns its calls' sideband alone: another key, and no key, cannot attach.
// Without the option the same key is refused with invalid_api_key.
func TestAnyAPIKey(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	cred := func(s *Server, bearer string) (credential, *authError) {
		r, _ := http.NewRequest(http.MethodPost, "/v1/realtime/calls", nil)
		if bearer != "" {
			r.Header.Set("Authorization", "Bearer "+bearer)
		}
		return s.credential(r, false)
	}
	secrets, err := newSecretMinter(key, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	open := &Server{cfg: Config{AllowAnonymous: true, AnyAPIKey: true}, calls: newCallMinter(key), secrets: secrets}
	closed := &Server{cfg: Config{AllowAnonymous: true}, calls: open.calls, secrets: secrets}

	if _, aerr := cred(closed, "sk-proj-from-a-snippet"); aerr == nil || aerr.code != "invalid_api_key" {
		t.Fatalf("without AnyAPIKey: %v, want invalid_api_key", aerr)
	}
	a, aerr := cred(open, "sk-proj-from-a-snippet")
	if aerr != nil || a.kind != credNone {
		t.Fatalf("with AnyAPIKey: %+v %v, want an anonymous caller", a, aerr)
	}
	b, _ := cred(open, "sk-proj-another")
	none, _ := cred(open, "")
	if _, aerr := cred(open, "ek_forged"); aerr == nil || aerr.code != "invalid_client_secret" {
		t.Errorf("a forged client secret: %v, want invalid_client_secret", aerr)
	}
	sid, serr := sessionid.New(1, 2)
	if serr != nil {
		t.Fatal(serr)
	}
	id := open.calls.publicID(sid.String(), a)
	for name, c := range map[string]credential{"the same key": a, "another key": b, "no key": none} {
		_, _, ok := open.calls.sidebandOwner(id, c)
		if want := name == "the same key"; ok != want {
			t.Errorf("sideband of a call placed with a key, attached with %s: %v, want %v", name, ok, want)
		}
	}
}
