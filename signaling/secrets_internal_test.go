package signaling

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// TestSecretSealsPolicy: a secret carries its minting key's caller policy
// when the key has one (so a browser cannot change it: the AEAD covers
// it), and none otherwise (the default applies where it is used, and a
// replica that predates policies reads the secret as before).
func TestSecretSealsPolicy(t *testing.T) {
	m, err := newSecretMinter([]byte("0123456789abcdef0123456789abcdef"), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	session := json.RawMessage(`{"instructions":"SEALED"}`)
	for _, p := range []*sessionapi.Caller{
		nil,
		{SessionFields: []string{"voice", "audio"}, SealedWins: true},
		{SessionFields: []string{}},
	} {
		s, _, err := m.mint(time.Minute, DefaultTenant, fingerprint{}, p, session)
		if err != nil {
			t.Fatal(err)
		}
		c, err := m.verify(s, false)
		if err != nil {
			t.Fatal(err)
		}
		if string(c.session) != string(session) {
			t.Errorf("policy %v: session %s", p, c.session)
		}
		switch {
		case p == nil && c.policy != nil:
			t.Errorf("no policy sealed, yet %v read", *c.policy)
		case p != nil && (c.policy == nil || !slices.Equal(c.policy.SessionFields, p.SessionFields) || c.policy.SealedWins != p.SealedWins):
			t.Errorf("sealed %v, read %v", *p, c.policy)
		}
	}
	if _, _, err := m.mint(time.Minute, DefaultTenant, fingerprint{}, &sessionapi.Caller{SessionFields: []string{""}}, nil); err == nil {
		t.Error("an empty field name was sealed")
	}
}
