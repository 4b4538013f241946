// Package authority is the deployment authority: the secrets every
// per-pod credential is derived from, which relays hold and transceiver
// pods never see (docs/operations.md, "Deployment authority").
//
// The hierarchy, each step HKDF-SHA256 (RFC 5869) unless said otherwise:
//
//	root (operator / Terraform only)
//	└─ cluster secret, per (cluster, key ID)   cluster relays of that cluster,
//	   │                                        global relays serving it, the
//	   │                                        pod key issuer of that cluster
//	   ├─ token master  → pod token key      (token.DerivePodKey, HMAC-SHA256)
//	   ├─ hop master    → pod hop key        (encap.DerivePodKey, SipHash-2-4)
//	   ├─ route key                           (route-cache MAC; relays only)
//	   ├─ relay key     → Ed25519 key pair   (cluster-pool proof of a relay;
//	   │                                        pods get the public key)
//	   ├─ member key of a pod                 (cluster-pool proof of a pod)
//	   │  └─ steering report key (HMAC)       (tags the pod's round-trip reports)
//	   ├─ steering ticket key                 (the front's tickets; relays only)
//	   └─ session API credential of a pod     (what the front presents)
//	└─ POP secret, per (POP, key ID)           that POP's global relays
//	   └─ POP key       → Ed25519 key pair   (global-pool proof of a global relay)
//	└─ signaling secret, per key ID            signaling replicas
//	   └─ signaling key → Ed25519 key pair   (global-pool proof of signaling)
//
// Members of the global pool prove their metadata with the key of their
// role and scope (global.go): a cluster relay with its cluster's relay
// key, a global relay with its POP's key, signaling with the signaling
// key. The same keys sign the steering samples a cluster relay and
// signaling pass on (steer.go). Verifiers that hold no secret of a scope
// are given its public keys ("relay-pub:CLUSTER/ID:BASE64",
// "pop-pub:POP/ID:BASE64", "signaling-pub/ID:BASE64";
// Secrets.PublicSpecs prints them).
//
// A pod is issued (Secrets.Pod) only its own keys, so it can mint routing
// tokens, seal hop headers, answer the session API and prove gossip
// metadata only in its own name; verifiers derive the claimed pod's key
// from the cluster secret (relays cache what they derive). Key IDs are the
// token and hop key IDs: a cluster secret under ID n yields token and hop
// keys under ID n, so rotation is the hop keys' install / use / remove.
// Secrets is immutable after Parse and safe for concurrent use.
package authority

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/keyspec"
	"github.com/rtcedge/rtcedge/internal/steer"
	"github.com/rtcedge/rtcedge/internal/token"
)

// KeyLen is the length of a root or cluster secret.
const KeyLen = 32

// MaxKeyID is the largest key ID (the token's and hop header's nibble).
const MaxKeyID = 15

// Labels of the derivations (HKDF info prefixes).
const (
	labelCluster = "rtcedge cluster v1"
	labelToken   = "rtcedge token master v1"
	labelHop     = "rtcedge hop master v1"
	labelRoute   = "rtcedge route v1"
	labelRelay   = "rtcedge relay member v1"
	labelMember  = "rtcedge pod member v1"
	labelAPI     = "rtcedge pod session api v1"
	labelTicket  = "rtcedge steer ticket key v1"
	labelReport  = "rtcedge steer report v1"
	labelPOP     = "rtcedge pop v1"
	labelPOPKey  = "rtcedge pop member v1"
	labelSig     = "rtcedge signaling v1"
	labelSigKey  = "rtcedge signaling member v1"
)

// derive is HKDF-SHA256 of secret with info label || cluster || pod.
func derive(secret []byte, label string, cluster, pod uint16, n int) []byte {
	info := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16([]byte(label), cluster), pod)
	out, err := hkdf.Key(sha256.New, secret, nil, string(info), n)
	if err != nil {
		panic("authority: hkdf: " + err.Error()) // only for n > 255*32
	}
	return out
}

// ClusterSecret derives cluster's secret from the root secret: what the
// issuer (rtcedge keys, Terraform) gives a cluster's relays and key
// issuer, and a global relay for every cluster it serves.
func ClusterSecret(root []byte, cluster uint16) []byte {
	return derive(root, labelCluster, cluster, 0, KeyLen)
}

// Secrets are cluster secrets by cluster and key ID, and the global
// pool's keys (global.go): POP and signaling secrets, and public keys.
type Secrets struct {
	by      map[uint16]map[uint8][]byte
	current map[uint16]uint8 // per cluster, the first ID listed
	// other holds every other kind of key by scope; per scope the first
	// ID listed is current.
	other map[scope]*keyset
}

// Parse reads key specs (separated by commas or newlines, each element
// may hold several), per scope the first listed current:
//
//	CLUSTER/ID:BASE64          a cluster secret (KeyLen bytes)
//	pop:POP/ID:BASE64          a POP secret (KeyLen bytes)
//	signaling/ID:BASE64        the signaling secret (KeyLen bytes)
//	relay-pub:CLUSTER/ID:B64   a cluster's relay public key (Ed25519)
//	pop-pub:POP/ID:B64         a POP's public key
//	signaling-pub/ID:B64       signaling's public key
func Parse(specs []string) (*Secrets, error) {
	s := &Secrets{by: map[uint16]map[uint8][]byte{}, current: map[uint16]uint8{}, other: map[scope]*keyset{}}
	n := 0
	for _, spec := range keyspec.Split(specs...) {
		head, rest, ok := strings.Cut(spec, "/")
		sc, err := parseScope(head)
		if !ok || err != nil {
			return nil, fmt.Errorf("authority: key %q: want CLUSTER/ID:BASE64, pop:POP/ID:BASE64, signaling/ID:BASE64 or their -pub forms", keyspec.Redact(spec))
		}
		klen := KeyLen
		if sc.kind.public() {
			klen = ed25519.PublicKeySize
		}
		id, key, err := keyspec.Parse("authority: "+sc.String(), rest, MaxKeyID, klen)
		if err != nil {
			return nil, err
		}
		if sc.kind == kindCluster {
			c := sc.n
			if s.by[c] == nil {
				s.by[c] = map[uint8][]byte{}
				s.current[c] = id
			}
			if _, dup := s.by[c][id]; dup {
				return nil, fmt.Errorf("authority: cluster %d key ID %d given twice", c, id)
			}
			s.by[c][id] = key
		} else if err := s.add(sc, id, key); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("authority: no keys")
	}
	return s, nil
}

// Spec formats a cluster secret as Parse reads it.
func Spec(cluster uint16, id uint8, secret []byte) string {
	return fmt.Sprintf("%d/%d:%s", cluster, id, base64.StdEncoding.EncodeToString(secret))
}

// Clusters lists the clusters s holds secrets of, ascending.
func (s *Secrets) Clusters() []uint16 {
	out := make([]uint16, 0, len(s.by))
	for c := range s.by {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Has reports whether s holds a secret of cluster.
func (s *Secrets) Has(cluster uint16) bool { return s.by[cluster] != nil }

// Current is cluster's current key ID.
func (s *Secrets) Current(cluster uint16) uint8 { return s.current[cluster] }

// ids lists cluster's key IDs, the current first.
func (s *Secrets) ids(cluster uint16) []uint8 {
	out := []uint8{s.current[cluster]}
	for id := range s.by[cluster] {
		if id != s.current[cluster] {
			out = append(out, id)
		}
	}
	slices.Sort(out[1:])
	return out
}

// TokenKeyring returns static (nil: none) with every held cluster's token
// masters added as derived IDs. Its minting ID is the lowest cluster's
// current ID; relays, its users, verify and never mint.
func (s *Secrets) TokenKeyring(static *token.Keyring) (*token.Keyring, error) {
	if len(s.by) == 0 {
		if static == nil {
			return nil, fmt.Errorf("authority: no cluster secret and no token keys")
		}
		return static, nil
	}
	masters := map[uint8]map[uint16][]byte{}
	for c, ids := range s.by {
		for id, sec := range ids {
			if masters[id] == nil {
				masters[id] = map[uint16][]byte{}
			}
			masters[id][c] = derive(sec, labelToken, c, 0, token.KeyLen)
		}
	}
	return static.WithMasters(s.current[s.Clusters()[0]], masters)
}

// HopKeyring returns static (nil: none) with cluster's hop masters and
// route keys added as derived IDs, sealing with cluster's current ID.
func (s *Secrets) HopKeyring(cluster uint16, static *encap.Keyring) (*encap.Keyring, error) {
	if !s.Has(cluster) {
		return nil, fmt.Errorf("authority: no key for cluster %d", cluster)
	}
	hop, route := map[uint8][]byte{}, map[uint8][]byte{}
	for id, sec := range s.by[cluster] {
		hop[id] = derive(sec, labelHop, cluster, 0, encap.KeyLen)
		route[id] = derive(sec, labelRoute, cluster, 0, encap.KeyLen)
	}
	return static.WithMasters(cluster, s.current[cluster], hop, route)
}

// ClusterKeys returns static (nil: none) with every held cluster's
// keyring extended by HopKeyring (a global relay).
func (s *Secrets) ClusterKeys(static *encap.ClusterKeys) (*encap.ClusterKeys, error) {
	m := map[uint16]*encap.Keyring{}
	for _, c := range static.Clusters() {
		m[c] = static.For(c)
	}
	for c := range s.by {
		k, err := s.HopKeyring(c, m[c])
		if err != nil {
			return nil, err
		}
		m[c] = k
	}
	return encap.NewClusterKeys(m), nil
}

// relayKey is cluster's relay signing key under key ID id.
func (s *Secrets) relayKey(cluster uint16, id uint8) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(derive(s.by[cluster][id], labelRelay, cluster, 0, ed25519.SeedSize))
}

// memberKey is pod's gossip proof key under key ID id.
func (s *Secrets) memberKey(cluster uint16, id uint8, pod uint16) []byte {
	return derive(s.by[cluster][id], labelMember, cluster, pod, 32)
}

// reportKey is the key a pod tags its round-trip reports with: an HMAC of
// its member key, so the pod's keys file needs nothing new.
func reportKey(member []byte) []byte {
	h := hmac.New(sha256.New, member)
	h.Write([]byte(labelReport))
	return h.Sum(nil)
}

// SteerAuthority is a cluster relay's keys for its pods' round-trip
// reports: it mints tickets for the creates its front passes on, checks
// the reports (internal/steer, report.go), and signs the samples it
// passes on to signaling with the cluster's current relay key (wire.go;
// steer.go). Pods hold neither the ticket keys nor another pod's report
// key.
func (s *Secrets) SteerAuthority(cluster uint16) (*steer.Authority, error) {
	if !s.Has(cluster) {
		return nil, fmt.Errorf("authority: no key for cluster %d", cluster)
	}
	tickets := map[uint8][]byte{}
	for id, sec := range s.by[cluster] {
		tickets[id] = derive(sec, labelTicket, cluster, 0, 32)
	}
	cache := newKeyCache(func(id uint8, pod uint16) []byte { return reportKey(s.memberKey(cluster, id, pod)) })
	cur := s.current[cluster]
	return &steer.Authority{
		Cluster:   cluster,
		Signer:    &steer.Signer{ID: steer.SignerID{Role: steer.SignerRelay, Cluster: cluster, KeyID: cur}, Key: s.relayKey(cluster, cur)},
		TicketID:  cur,
		TicketKey: func(id uint8) []byte { return tickets[id] },
		ReportKey: func(id uint8, pod uint16) []byte {
			if s.by[cluster][id] == nil {
				return nil
			}
			return cache.get(id, pod)
		},
	}, nil
}

// SessionAPICredential is the bearer credential the front presents to
// pod (under cluster's current key ID); "" when s holds no secret of
// cluster. Only that pod accepts it.
func (s *Secrets) SessionAPICredential(cluster, pod uint16) string {
	if !s.Has(cluster) {
		return ""
	}
	return apiCredential(s.by[cluster][s.current[cluster]], cluster, pod)
}

func apiCredential(secret []byte, cluster, pod uint16) string {
	return base64.RawURLEncoding.EncodeToString(derive(secret, labelAPI, cluster, pod, 32))
}

// Pod issues pod's keys: what its key issuer writes for it, and all it
// ever holds.
func (s *Secrets) Pod(cluster, pod uint16) (PodKeys, error) {
	if !s.Has(cluster) {
		return PodKeys{}, fmt.Errorf("authority: no key for cluster %d", cluster)
	}
	k := PodKeys{Cluster: cluster, Pod: pod}
	b64 := base64.StdEncoding.EncodeToString
	for _, id := range s.ids(cluster) {
		sec := s.by[cluster][id]
		k.Token = append(k.Token, fmt.Sprintf("%d:%s", id, b64(token.DerivePodKey(derive(sec, labelToken, cluster, 0, token.KeyLen), cluster, pod))))
		k.Hop = append(k.Hop, fmt.Sprintf("%d/%d:%s", cluster, id, b64(encap.DerivePodKey(derive(sec, labelHop, cluster, 0, encap.KeyLen), cluster, pod))))
		k.Member = append(k.Member, fmt.Sprintf("%d:%s", id, b64(s.memberKey(cluster, id, pod))))
		k.Relay = append(k.Relay, fmt.Sprintf("%d:%s", id, b64(s.relayKey(cluster, id).Public().(ed25519.PublicKey))))
		k.SessionAPI = append(k.SessionAPI, apiCredential(sec, cluster, pod))
	}
	return k, nil
}
