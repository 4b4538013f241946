package authority

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// kind is what a key spec holds.
type kind uint8

const (
	kindCluster      kind = iota // cluster secret
	kindPOP                      // POP secret
	kindSignaling                // signaling secret
	kindRelayPub                 // a cluster's relay public key
	kindPOPPub                   // a POP's public key
	kindSignalingPub             // signaling's public key
)

func (k kind) public() bool { return k >= kindRelayPub }

// pub is the public kind of a secret kind.
func (k kind) pub() kind { return k + kindRelayPub }

var kindNames = map[kind]string{kindPOP: "pop", kindSignaling: "signaling",
	kindRelayPub: "relay-pub", kindPOPPub: "pop-pub", kindSignalingPub: "signaling-pub"}

// scope is a kind and the cluster or POP it belongs to (0 for signaling).
type scope struct {
	kind kind
	n    uint16
}

func (s scope) String() string {
	switch s.kind {
	case kindCluster:
		return "cluster " + strconv.Itoa(int(s.n))
	case kindSignaling, kindSignalingPub:
		return kindNames[s.kind]
	}
	return kindNames[s.kind] + " " + strconv.Itoa(int(s.n))
}

// parseScope parses a spec's head: "CLUSTER", "pop:POP", "signaling",
// "relay-pub:CLUSTER", "pop-pub:POP" or "signaling-pub".
func parseScope(head string) (scope, error) {
	switch head {
	case "signaling":
		return scope{kind: kindSignaling}, nil
	case "signaling-pub":
		return scope{kind: kindSignalingPub}, nil
	}
	name, num, hasNum := strings.Cut(head, ":")
	if !hasNum {
		name, num = "", head
	}
	var k kind
	switch name {
	case "":
		k = kindCluster
	case "pop":
		k = kindPOP
	case "relay-pub":
		k = kindRelayPub
	case "pop-pub":
		k = kindPOPPub
	default:
		return scope{}, fmt.Errorf("unknown kind %q", name)
	}
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return scope{}, fmt.Errorf("number %q: want 1..65535", num)
	}
	return scope{kind: k, n: uint16(n)}, nil
}

// keyset is one scope's keys by ID; current is the first listed.
type keyset struct {
	ids     map[uint8][]byte
	current uint8
}

func (s *Secrets) add(sc scope, id uint8, key []byte) error {
	ks := s.other[sc]
	if ks == nil {
		ks = &keyset{ids: map[uint8][]byte{}, current: id}
		s.other[sc] = ks
	}
	if _, dup := ks.ids[id]; dup {
		return fmt.Errorf("authority: %s key ID %d given twice", sc, id)
	}
	ks.ids[id] = key
	return nil
}

// POPSecret derives pop's secret from the root secret: what the issuer
// gives that POP's global relays (and nobody else).
func POPSecret(root []byte, pop uint16) []byte { return derive(root, labelPOP, pop, 0, KeyLen) }

// SignalingSecret derives the signaling replicas' secret from the root.
func SignalingSecret(root []byte) []byte { return derive(root, labelSig, 0, 0, KeyLen) }

// POPSpec formats a POP secret as Parse reads it.
func POPSpec(pop uint16, id uint8, secret []byte) string {
	return fmt.Sprintf("pop:%d/%d:%s", pop, id, base64.StdEncoding.EncodeToString(secret))
}

// SignalingSpec formats the signaling secret as Parse reads it.
func SignalingSpec(id uint8, secret []byte) string {
	return fmt.Sprintf("signaling/%d:%s", id, base64.StdEncoding.EncodeToString(secret))
}

// signer is the Ed25519 key of a secret of scope sc under key ID id.
func (s *Secrets) signer(sc scope, id uint8) ed25519.PrivateKey {
	switch sc.kind {
	case kindCluster:
		return s.relayKey(sc.n, id)
	case kindPOP:
		return ed25519.NewKeyFromSeed(derive(s.other[sc].ids[id], labelPOPKey, sc.n, 0, ed25519.SeedSize))
	default: // kindSignaling
		return ed25519.NewKeyFromSeed(derive(s.other[sc].ids[id], labelSigKey, 0, 0, ed25519.SeedSize))
	}
}

// secretIDs lists the key IDs of secret scope sc, the current first; nil
// when s holds none.
func (s *Secrets) secretIDs(sc scope) []uint8 {
	if sc.kind == kindCluster {
		if !s.Has(sc.n) {
			return nil
		}
		return s.ids(sc.n)
	}
	ks := s.other[sc]
	if ks == nil {
		return nil
	}
	out := []uint8{ks.current}
	for id := range ks.ids {
		if id != ks.current {
			out = append(out, id)
		}
	}
	slices.Sort(out[1:])
	return out
}

// secretScopes lists every secret scope s holds, in a stable order.
func (s *Secrets) secretScopes() []scope {
	var out []scope
	for _, c := range s.Clusters() {
		out = append(out, scope{kindCluster, c})
	}
	for sc := range s.other {
		if !sc.kind.public() {
			out = append(out, sc)
		}
	}
	slices.SortFunc(out, func(a, b scope) int { return int(a.kind)*65536 + int(a.n) - int(b.kind)*65536 - int(b.n) })
	return out
}

// PublicSpecs lists the public keys of every secret s holds, current
// first per scope: what verifiers without those secrets are given
// (signaling: every cluster's relay keys and every POP's keys; cluster
// relays: signaling's).
func (s *Secrets) PublicSpecs() []string {
	var out []string
	for _, sc := range s.secretScopes() {
		ps := scope{sc.kind.pub(), sc.n}
		for _, id := range s.secretIDs(sc) {
			out = append(out, fmt.Sprintf("%s/%d:%s", headOf(ps), id,
				base64.StdEncoding.EncodeToString(s.signer(sc, id).Public().(ed25519.PublicKey))))
		}
	}
	return out
}

func headOf(sc scope) string {
	if sc.kind == kindSignaling || sc.kind == kindSignalingPub {
		return kindNames[sc.kind]
	}
	return kindNames[sc.kind] + ":" + strconv.Itoa(int(sc.n))
}

// globalPubs are the global pool's verification keys by public scope and
// key ID: the public keys of every secret s holds and the public keys it
// was given; and the kinds of scope it holds any key of.
func (s *Secrets) globalPubs() (map[scope]map[uint8]ed25519.PublicKey, map[kind]bool) {
	pubs := map[scope]map[uint8]ed25519.PublicKey{}
	kinds := map[kind]bool{}
	put := func(sc scope, id uint8, k ed25519.PublicKey) {
		if pubs[sc] == nil {
			pubs[sc] = map[uint8]ed25519.PublicKey{}
		}
		pubs[sc][id] = k
		kinds[sc.kind] = true
	}
	for _, sc := range s.secretScopes() {
		for _, id := range s.secretIDs(sc) {
			put(scope{sc.kind.pub(), sc.n}, id, s.signer(sc, id).Public().(ed25519.PublicKey))
		}
	}
	for sc, ks := range s.other {
		if sc.kind.public() {
			for id, k := range ks.ids {
				put(sc, id, ed25519.PublicKey(k))
			}
		}
	}
	return pubs, kinds
}

// globalDomain starts what a global-pool proof signs, so that a
// cluster-pool proof (the same relay key) never passes for one.
const globalDomain = "rtcedge global pool v1\x00"

// roleScope is the secret scope that proves m's role in the global pool:
// its cluster's, its POP's, or signaling's.
func roleScope(m membership.Meta) (scope, bool) {
	switch m.Role {
	case membership.RoleClusterRelay:
		return scope{kindCluster, m.Cluster}, true
	case membership.RoleGlobalRelay:
		return scope{kindPOP, m.POP}, true
	case membership.RoleSignaling:
		return scope{kind: kindSignaling}, true
	}
	return scope{}, false
}

// GlobalProve returns the membership.Config.Prove of a global pool member
// with meta (its role, cluster or POP): an Ed25519 signature under the
// current key of its role's scope — a cluster relay its cluster's relay
// key, a global relay its POP's key, signaling the signaling key. nil
// (and no error) when s holds no secret of that scope: the member runs
// unproven, and verifiers holding keys of its kind refuse it.
func (s *Secrets) GlobalProve(meta membership.Meta) (func([]byte) []byte, error) {
	sc, ok := roleScope(meta)
	if !ok {
		return nil, fmt.Errorf("authority: role %q has no place in the global pool", meta.Role)
	}
	ids := s.secretIDs(sc)
	if ids == nil {
		return nil, nil
	}
	id, priv := ids[0], s.signer(sc, ids[0])
	return func(input []byte) []byte {
		msg := append([]byte(globalDomain), input...)
		return append([]byte{id}, ed25519.Sign(priv, msg)...)
	}, nil
}

// GlobalCheck returns the global pool's membership.Config.CheckMember.
// A member must prove its role's metadata with a key of its own scope
// (GlobalProve): a cluster relay speaks only for its cluster, a global
// relay only for its POP, and nobody else can pass for either or for
// signaling. A cluster relay's data address and session API must be on
// its gossip address (global relays forward there, signaling sends offers
// there), so a proven metadata replayed from elsewhere is refused. A
// transceiver never belongs to the global pool.
//
// The verification keys are the public keys of every secret s holds and
// the public keys it was given. A member of a scope with no key passes
// unless strict is set and s holds a key of that scope's kind: signaling
// (strict) then refuses a cluster relay of a cluster it has no relay key
// of, while a global relay (not strict) passes relays of clusters it
// serves by shared keys only, which it cannot check anyway.
func (s *Secrets) GlobalCheck(strict bool) func(membership.Member, []byte) error {
	pubs, kinds := s.globalPubs()
	return func(m membership.Member, input []byte) error {
		sc, ok := roleScope(m.Meta)
		if !ok {
			return refuse("%s: role %q in the global pool", m.Name, m.Meta.Role)
		}
		ps := scope{sc.kind.pub(), sc.n}
		keys := pubs[ps]
		if keys == nil {
			if strict && kinds[ps.kind] {
				return refuse("%s: no key of %s", m.Name, ps)
			}
			return nil
		}
		p := m.Meta.Proof
		if len(p) != 1+ed25519.SignatureSize {
			return refuse("%s (%s): no proof", m.Name, ps)
		}
		k := keys[p[0]]
		if k == nil || !ed25519.Verify(k, append([]byte(globalDomain), input...), []byte(p[1:])) {
			return refuse("%s: proof does not verify under %s", m.Name, ps)
		}
		if m.Meta.Role == membership.RoleClusterRelay {
			return checkAddrs(m, true)
		}
		return nil
	}
}
