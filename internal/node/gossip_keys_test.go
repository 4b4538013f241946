package node

import (
	"encoding/base64"
	"testing"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// TestGossipKeyPerPool: a pool's own key wins over $RTCEDGE_GOSSIP_KEY
// (which used to overwrite every pool's, handing transceivers the global
// pool's key), the variable fills only a pool without one, and rotation
// keys reach the pool's keyring.
func TestGossipKeyPerPool(t *testing.T) {
	own := base64.StdEncoding.EncodeToString([]byte("cluster-pool-key-0123456"))
	shared := base64.StdEncoding.EncodeToString([]byte("shared-env-key-012345678"))
	old := base64.StdEncoding.EncodeToString([]byte("old-cluster-key-01234567"))
	t.Setenv(EnvGossipKey, shared)
	g := Gossip{Key: own}
	g.ApplyEnv()
	if g.Key != own {
		t.Fatalf("the pool's own key was replaced by $%s", EnvGossipKey)
	}
	var unset Gossip
	unset.ApplyEnv()
	if unset.Key != shared {
		t.Fatalf("a pool without a key did not take $%s", EnvGossipKey)
	}
	g = Gossip{Name: "k", Bind: "127.0.0.1:0", Key: own, Keys: []string{old}, Fast: true}
	if err := g.Validate("gossip"); err != nil {
		t.Fatal(err)
	}
	p, err := g.Open("", false, membership.Meta{Role: membership.RoleTransceiver, Cluster: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if ks := p.Keys(); len(ks) != 2 || base64.StdEncoding.EncodeToString(ks[0]) != own {
		t.Fatalf("keyring %q, want the pool's key first and the rotation key", ks)
	}
	if err := (&Gossip{Bind: "127.0.0.1:0", Key: own, Keys: []string{"not base64!"}}).Validate("gossip"); err == nil {
		t.Fatal("a bad rotation key validated")
	}
}
