package authority

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/rtcedge/rtcedge/internal/keyspec"
	"github.com/rtcedge/rtcedge/internal/membership"
)

// PodKeys is everything one transceiver pod holds: its own token, hop,
// member and session API keys, and its cluster's relay public keys, each
// list with the current key ID first. The key issuer writes it (WriteFile)
// where the pod's config (pod_keys) reads it.
type PodKeys struct {
	Cluster uint16 `yaml:"cluster"`
	Pod     uint16 `yaml:"pod"`
	// Token are "ID:BASE64" routing-token keys (token.keys).
	Token []string `yaml:"token"`
	// Hop are "CLUSTER/ID:BASE64" hop keys (hop_keys.keys).
	Hop []string `yaml:"hop"`
	// Member are "ID:BASE64" keys that prove the pod's gossip metadata.
	Member []string `yaml:"member"`
	// Relay are "ID:BASE64" Ed25519 public keys of the cluster's relays:
	// only a member proving itself with one is taken for a relay.
	Relay []string `yaml:"relay"`
	// SessionAPI are the bearer credentials the pod's session API accepts
	// (the front presents the current one).
	SessionAPI []string `yaml:"session_api"`
}

// WriteFile writes k to path (mode 0600).
func (k PodKeys) WriteFile(path string) error {
	b, err := yaml.Marshal(k)
	if err != nil {
		return fmt.Errorf("authority: pod keys: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("authority: write pod keys: %w", err)
	}
	return nil
}

// ReadPodKeys reads and checks a file WriteFile wrote.
func ReadPodKeys(path string) (PodKeys, error) {
	var k PodKeys
	b, err := os.ReadFile(path)
	if err != nil {
		return k, fmt.Errorf("pod_keys: %w", err)
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return k, fmt.Errorf("pod_keys %s: %w", path, err)
	}
	if _, err := k.memberKeys(); err != nil {
		return k, fmt.Errorf("pod_keys %s: %w", path, err)
	}
	if _, err := k.relayKeys(); err != nil {
		return k, fmt.Errorf("pod_keys %s: %w", path, err)
	}
	if k.Cluster == 0 || len(k.Token) == 0 || len(k.Hop) == 0 || len(k.SessionAPI) == 0 {
		return k, fmt.Errorf("pod_keys %s: cluster, token, hop, member, relay and session_api are required", path)
	}
	return k, nil
}

type idKey struct {
	id  uint8
	key []byte
}

func parseIDKeys(what string, specs []string, n int) ([]idKey, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("no %s keys", what)
	}
	out := make([]idKey, 0, len(specs))
	for _, s := range specs {
		id, key, err := keyspec.Parse(what, s, MaxKeyID, n)
		if err != nil {
			return nil, err
		}
		out = append(out, idKey{id, key})
	}
	return out, nil
}

func (k PodKeys) memberKeys() ([]idKey, error) { return parseIDKeys("member", k.Member, 32) }
func (k PodKeys) relayKeys() ([]idKey, error) {
	return parseIDKeys("relay", k.Relay, ed25519.PublicKeySize)
}

// SteerReportKey is the key ID and key the pod tags its round-trip
// reports with (internal/steer, report.go): its current member key's.
func (k PodKeys) SteerReportKey() (uint8, []byte, error) {
	keys, err := k.memberKeys()
	if err != nil {
		return 0, nil, err
	}
	return keys[0].id, reportKey(keys[0].key), nil
}

// Proof layouts: key ID, then for a pod the first podTagLen bytes of
// HMAC-SHA256(member key, input), for a relay an Ed25519 signature.
const podTagLen = 16

// ErrProof is wrapped by every refusal of CheckMember.
var ErrProof = errors.New("member not proven by the deployment authority")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProof, fmt.Sprintf(format, args...))
}

func podTag(key, input []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(input)
	return h.Sum(nil)[:podTagLen]
}

// Prove returns the pod's membership.Config.Prove: a proof under its
// current member key.
func (k PodKeys) Prove() (func([]byte) []byte, error) {
	keys, err := k.memberKeys()
	if err != nil {
		return nil, err
	}
	cur := keys[0]
	return func(input []byte) []byte { return append([]byte{cur.id}, podTag(cur.key, input)...) }, nil
}

// CheckMember returns the pod's membership.Config.CheckMember: a cluster
// relay must prove itself with one of the relay keys, from its gossip
// address. Other pods' proofs a pod cannot check (it holds no other
// pod's key) and it routes nothing to them, so they pass.
func (k PodKeys) CheckMember() (func(membership.Member, []byte) error, error) {
	keys, err := k.relayKeys()
	if err != nil {
		return nil, err
	}
	pub := map[uint8]ed25519.PublicKey{}
	for _, r := range keys {
		pub[r.id] = r.key
	}
	return func(m membership.Member, input []byte) error {
		if m.Meta.Role != membership.RoleClusterRelay {
			return nil
		}
		return checkRelay(m, input, k.Cluster, func(id uint8) ed25519.PublicKey { return pub[id] })
	}, nil
}

// RelayProve returns a cluster relay's membership.Config.Prove for its
// cluster pool: an Ed25519 signature under the cluster's current relay
// key, which pods can check and not make.
func (s *Secrets) RelayProve(cluster uint16) (func([]byte) []byte, error) {
	if !s.Has(cluster) {
		return nil, fmt.Errorf("authority: no key for cluster %d", cluster)
	}
	id := s.current[cluster]
	priv := s.relayKey(cluster, id)
	return func(input []byte) []byte { return append([]byte{id}, ed25519.Sign(priv, input)...) }, nil
}

// CheckMember returns a cluster relay's membership.Config.CheckMember for
// cluster's pool: every transceiver must prove its pod ID with that pod's
// member key, every relay with the relay key, and each must advertise
// addresses on its own gossip address. So no member holding one pod's
// keys can claim another pod ID, or a relay's role, or route offers or
// datagrams to an address of its choosing.
func (s *Secrets) CheckMember(cluster uint16) (func(membership.Member, []byte) error, error) {
	if !s.Has(cluster) {
		return nil, fmt.Errorf("authority: no key for cluster %d", cluster)
	}
	pubs := map[uint8]ed25519.PublicKey{}
	for id := range s.by[cluster] {
		pubs[id] = s.relayKey(cluster, id).Public().(ed25519.PublicKey)
	}
	// Member keys are derived once per (key ID, pod); the check runs on
	// every metadata change of every pod.
	cache := newKeyCache(func(id uint8, pod uint16) []byte { return s.memberKey(cluster, id, pod) })
	return func(m membership.Member, input []byte) error {
		switch m.Meta.Role {
		case membership.RoleClusterRelay:
			return checkRelay(m, input, cluster, func(id uint8) ed25519.PublicKey { return pubs[id] })
		case membership.RoleTransceiver:
		default:
			return refuse("role %q in cluster %d's pool", m.Meta.Role, cluster)
		}
		p := m.Meta.Proof
		if len(p) != 1+podTagLen || m.Meta.Cluster != cluster {
			return refuse("pod %d of cluster %d: no pod proof", m.Meta.Pod, m.Meta.Cluster)
		}
		id := p[0]
		if s.by[cluster][id] == nil {
			return refuse("pod %d: unknown key ID %d", m.Meta.Pod, id)
		}
		want := podTag(cache.get(id, m.Meta.Pod), input)
		if subtle.ConstantTimeCompare(want, []byte(p[1:])) != 1 {
			return refuse("pod %d: proof does not verify", m.Meta.Pod)
		}
		return checkAddrs(m, true)
	}, nil
}

func checkRelay(m membership.Member, input []byte, cluster uint16, pub func(uint8) ed25519.PublicKey) error {
	p := m.Meta.Proof
	if len(p) != 1+ed25519.SignatureSize || m.Meta.Cluster != cluster {
		return refuse("relay of cluster %d: no relay proof", m.Meta.Cluster)
	}
	k := pub(p[0])
	if k == nil || !ed25519.Verify(k, input, []byte(p[1:])) {
		return refuse("relay %s: proof does not verify", m.Name)
	}
	return checkAddrs(m, false)
}

// checkAddrs requires the member's data address (and, with api, its
// session API's host) to be on its gossip address's IP: a member can
// direct traffic only to itself.
func checkAddrs(m membership.Member, api bool) error {
	ip := m.Addr.Addr().Unmap()
	if m.Meta.Data.IsValid() && m.Meta.Data.Addr().Unmap() != ip {
		return refuse("%s: data address %v is not its gossip address %v", m.Name, m.Meta.Data, ip)
	}
	if api && m.Meta.API != "" {
		u, err := url.Parse(m.Meta.API)
		var host netip.Addr
		if err == nil {
			host, err = netip.ParseAddr(strings.Trim(u.Hostname(), "[]"))
		}
		if err != nil || host.Unmap() != ip {
			return refuse("%s: session API %q is not on its gossip address %v", m.Name, m.Meta.API, ip)
		}
	}
	return nil
}

// keyCache derives keys once per (key ID, pod).
type keyCache struct {
	derive func(uint8, uint16) []byte
	mu     sync.Mutex
	m      map[uint32][]byte
}

func newKeyCache(derive func(uint8, uint16) []byte) *keyCache {
	return &keyCache{derive: derive, m: map[uint32][]byte{}}
}

func (c *keyCache) get(id uint8, pod uint16) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := uint32(id)<<16 | uint32(pod)
	if v, ok := c.m[k]; ok {
		return v
	}
	v := c.derive(id, pod)
	if len(c.m) < 1<<16 {
		c.m[k] = v
	}
	return v
}
