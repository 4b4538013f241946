package signaling

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// TestCallIDSidebandOwner: a call ID binds its sideband to the credential
// that created the call — the API key that placed it, the key that minted
// the client secret that placed it (sealed in the secret), or anonymous —
// and to no other key, even of the same tenant (which may still hang it
// up). An ID without the sideband tag (minted before it) still hangs up
// but attaches nothing; a tampered tag attaches nothing.
func TestCallIDSidebandOwner(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	m := newCallMinter(key)
	secrets, err := newSecretMinter(key, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	apiKey := func(k string) credential {
		return credential{kind: credAPIKey, tenant: DefaultTenant, owner: m.keyFingerprint(k, false)}
	}
	app, other := apiKey("sk-app-0123456789"), apiKey("sk-other-0123456789")
	anon := credential{kind: credNone, owner: m.keyFingerprint("", true)}
	if anon.owner == apiKey("").owner {
		t.Fatal("anonymous has the fingerprint of an empty key")
	}
	val, _, err := secrets.mint(time.Minute, DefaultTenant, app.owner, nil, json.RawMessage(`{"instructions":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	claims, err := secrets.verify(val, false)
	if err != nil || claims.owner != app.owner || string(claims.session) != `{"instructions":"x"}` {
		t.Fatalf("secret: owner %x session %s err %v", claims.owner, claims.session, err)
	}
	viaSecret := credential{kind: credSecret, tenant: claims.tenant, secret: claims, owner: claims.owner}

	sid, err := sessionid.New(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	session := sid.String()
	for _, tc := range []struct {
		name   string
		placed credential
		attach map[string]bool // credential → may attach
	}{
		{"placed with the app's key", app, map[string]bool{"app": true, "other": false, "anon": false}},
		{"placed with the app's secret", viaSecret, map[string]bool{"app": true, "other": false, "anon": false}},
		{"placed anonymously", anon, map[string]bool{"app": false, "other": false, "anon": true}},
	} {
		creds := map[string]credential{"app": app, "other": other, "anon": anon}
		id := m.publicID(session, tc.placed)
		for name, want := range tc.attach {
			if _, _, ok := m.sidebandOwner(id, creds[name]); ok != want {
				t.Errorf("%s: %s attaches %v, want %v", tc.name, name, ok, want)
			}
		}
	}

	id := m.publicID(session, viaSecret)
	sess, capa, _ := strings.Cut(id, ".")
	old := sess + "." + capa[:32] // the 24-byte capability of older IDs (base64: 32 characters)
	if _, _, ok := m.owner(old, other); !ok {
		t.Error("an older call ID no longer hangs up for a key of its tenant")
	}
	if _, _, ok := m.owner(id, other); !ok {
		t.Error("a key of the tenant cannot hang up")
	}
	if _, _, ok := m.sidebandOwner(old, app); ok {
		t.Error("an older call ID attaches a sideband")
	}
	tampered := []byte(id)
	tampered[len(tampered)-1] ^= 1
	if _, _, ok := m.sidebandOwner(string(tampered), app); ok {
		t.Error("a tampered sideband tag attaches")
	}
}
