package steer

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Samples travel between roles as gossip user messages (datagrams,
// encrypted with the pool's key). A pod sends its report (report.go) to
// one cluster relay of its cluster pool; the relay checks it and passes
// its samples, stamped with the pod as their reporter, to every signaling
// member of the global pool (which pods are not in) as samples messages;
// a signaling replica that takes samples from `rtcedge probe` passes them
// on to the other replicas the same way, stamped with the probe's key.
//
// The gossip key proves only that the sender is in the pool, not which
// member it is (user messages carry no sender), so each samples message
// is signed by its sender's role key: a cluster relay's (its cluster's
// relay key, internal/authority) for its pods' samples, signaling's for
// probes' samples. The signature is Ed25519ctx (RFC 8032, section 5.1)
// with the context SignContext over every byte before it.
//
//	message: MsgKind (1) | version 3 (1) | source (1) | reporter (4) | signer (4) | time (4) | count (1) | count × sample | signature (64)
//	signer:  role (1) | cluster (2) | key ID (1)
//	sample:  key length (1) | key text (Key.String) | POP (2) | RTT in 100 µs (2)
//
// Integers are big-endian; time is Unix seconds. A pod's reporter is
// PodReporter (its cluster is not 0), a probe's ProbeReporter (cluster 0).
// A pod's samples are signed by the relay of the reporter's cluster
// (role SignerRelay, that cluster), a probe's by signaling (role
// SignerSignaling, cluster 0). Without the deployment authority there is
// no key to sign with: role, cluster, key ID and signature are zero.

// MsgKind is the first byte of a samples message; other gossip user
// messages start with other bytes.
const MsgKind = 'S'

const wireVersion = 3

const headerLen = 16

// SignatureLen is the length of a samples message's signature.
const SignatureLen = ed25519.SignatureSize

// MaxMessage bounds a samples message: it must fit a gossip datagram.
const MaxMessage = 1200

// SignContext is the Ed25519ctx context of a samples message's
// signature: no other message signed with the same key (a member's
// metadata proof, signed as plain Ed25519) verifies as one.
const SignContext = "rtcedge steer samples v3"

// MessageMaxAge is how long after it was signed a samples message is
// taken; one signed more than messageSkew ahead of the receiver's clock
// is refused too. A relay passes samples on at once: the window only
// covers transit and the clocks' skew, and bounds replays.
const MessageMaxAge = time.Minute

const messageSkew = 10 * time.Second

// Source says who measured a batch of samples.
type Source uint8

// Sources of samples.
const (
	SourcePod   Source = 1 // a pod's probe of a call's client through a POP
	SourceProbe Source = 2 // a synthetic client of `rtcedge probe`
)

// String names the source in metrics.
func (s Source) String() string {
	switch s {
	case SourcePod:
		return "pod"
	case SourceProbe:
		return "probe"
	}
	return "unknown"
}

// SignerRole is the role whose key signed a samples message.
type SignerRole uint8

// Signer roles.
const (
	Unsigned        SignerRole = 0 // no deployment authority: no key
	SignerRelay     SignerRole = 1 // a cluster relay, with its cluster's relay key
	SignerSignaling SignerRole = 2 // a signaling replica, with the signaling key
)

// SignerID names the key that signed a message: the role, the relay's
// cluster (0 for signaling) and the key ID in that scope.
type SignerID struct {
	Role    SignerRole
	Cluster uint16
	KeyID   uint8
}

// Signer is the key a role signs its samples messages with. It is
// immutable and safe for concurrent use.
type Signer struct {
	ID  SignerID
	Key ed25519.PrivateKey
}

var errMessage = errors.New("steer: malformed samples message")

// AppendMessage appends to b one message of samples from reporter from
// with as many of samples as fit in MaxMessage, signed by sg at now (nil:
// unsigned), and returns it with the number taken.
func AppendMessage(b []byte, sg *Signer, now time.Time, src Source, from Reporter, samples []Sample) ([]byte, int) {
	start := len(b)
	var id SignerID
	if sg != nil {
		id = sg.ID
	}
	b = append(b, MsgKind, wireVersion, byte(src))
	b = binary.BigEndian.AppendUint32(b, uint32(from))
	b = append(b, byte(id.Role))
	b = binary.BigEndian.AppendUint16(b, id.Cluster)
	b = append(b, id.KeyID)
	b = binary.BigEndian.AppendUint32(b, uint32(now.Unix()))
	b = append(b, 0)
	n := 0
	for _, s := range samples {
		if n == 255 {
			break
		}
		key := s.Key.String()
		if len(b)-start+1+len(key)+4+SignatureLen > MaxMessage {
			break
		}
		b = append(b, byte(len(key)))
		b = append(b, key...)
		b = binary.BigEndian.AppendUint16(b, s.POP)
		b = binary.BigEndian.AppendUint16(b, uint16(min(MaxRTT, max(rttUnit, s.RTT))/rttUnit))
		n++
	}
	b[start+headerLen-1] = byte(n)
	if sg == nil {
		return append(b, make([]byte, SignatureLen)...), n
	}
	sig, err := sg.Key.Sign(nil, b[start:], &ed25519.Options{Context: SignContext})
	if err != nil {
		panic("steer: ed25519ctx: " + err.Error()) // only for a context over 255 bytes
	}
	return append(b, sig...), n
}

// Message is a samples message as ParseMessage read it; Verifier.Verify
// says whether to believe it.
type Message struct {
	Source  Source
	From    Reporter
	Signer  SignerID
	Time    uint32 // Unix seconds, when it was signed
	Samples []Sample
	signed  []byte // the bytes the signature covers (aliases the input)
	sig     []byte
}

// ParseMessage reads a samples message whole, or fails: a message with
// one bad sample, or whose reporter is not of its source's kind, is
// garbage. It checks the format only; the returned message aliases b.
func ParseMessage(b []byte) (Message, error) {
	if len(b) < headerLen+SignatureLen || b[0] != MsgKind || b[1] != wireVersion || len(b) > MaxMessage {
		return Message{}, errMessage
	}
	m := Message{Source: Source(b[2]), From: Reporter(binary.BigEndian.Uint32(b[3:])),
		Signer: SignerID{Role: SignerRole(b[7]), Cluster: binary.BigEndian.Uint16(b[8:]), KeyID: b[10]},
		Time:   binary.BigEndian.Uint32(b[11:]),
		signed: b[:len(b)-SignatureLen], sig: b[len(b)-SignatureLen:]}
	if (m.Source != SourcePod || !m.From.IsPod()) && (m.Source != SourceProbe || m.From.IsPod()) {
		return Message{}, errMessage
	}
	count := int(b[headerLen-1])
	p := m.signed[headerLen:]
	m.Samples = make([]Sample, 0, count)
	for range count {
		s, rest, err := readSample(p)
		if err != nil {
			return Message{}, err
		}
		m.Samples = append(m.Samples, s)
		p = rest
	}
	if len(p) != 0 {
		return Message{}, errMessage
	}
	return m, nil
}

// readSample reads one sample: key length, key, POP, RTT.
func readSample(b []byte) (Sample, []byte, error) {
	if len(b) < 1 || len(b) < 1+int(b[0])+4 {
		return Sample{}, nil, errMessage
	}
	kl := int(b[0])
	k, err := ParseKey(string(b[1 : 1+kl]))
	if err != nil {
		return Sample{}, nil, fmt.Errorf("%w: %w", errMessage, err)
	}
	b = b[1+kl:]
	s := Sample{Key: k, POP: binary.BigEndian.Uint16(b), RTT: time.Duration(binary.BigEndian.Uint16(b[2:])) * rttUnit}
	if err := s.check(); err != nil {
		return Sample{}, nil, fmt.Errorf("%w: %w", errMessage, err)
	}
	return s, b[4:], nil
}

// Drop is why a samples message was dropped whole; its String is the
// metric label.
type Drop uint8

// Reasons to drop a samples message.
const (
	Accepted      Drop = iota // not dropped
	DropInvalid               // malformed, or a POP the catalogue lacks
	DropUnsigned              // no signature where keys are held
	DropUnknown               // no key of the signer's scope and key ID (an unknown cluster)
	DropWrongRole             // pod samples not signed by their own cluster's relay, probe samples not by signaling
	DropSignature             // the signature does not verify
	DropStale                 // signed over MessageMaxAge ago, or ahead of the clock
)

// Drops lists every reason, for metrics set to zero at start.
var Drops = []Drop{DropInvalid, DropUnsigned, DropUnknown, DropWrongRole, DropSignature, DropStale}

// String is the reason as a metric label.
func (d Drop) String() string {
	switch d {
	case Accepted:
		return "accepted"
	case DropInvalid:
		return "invalid"
	case DropUnsigned:
		return "unsigned"
	case DropUnknown:
		return "unknown_signer"
	case DropWrongRole:
		return "wrong_signer"
	case DropSignature:
		return "bad_signature"
	case DropStale:
		return "stale"
	}
	return "unknown"
}

// Verifier checks who signed samples messages: the public keys of the
// relays of every cluster, and of signaling, that the deployment
// authority gave the receiver. It is immutable and safe for concurrent
// use.
type Verifier struct {
	// Key is the public key of id, nil if the receiver holds none (a
	// cluster it has no key of, a key ID retired or not yet installed).
	Key func(id SignerID) ed25519.PublicKey
}

// Verify believes m only if the key of its reporter's role and scope
// signed it within MessageMaxAge of now: a pod's samples the relay key
// of that pod's own cluster, a probe's the signaling key. A nil v holds
// no keys (no deployment authority): it believes every message.
func (v *Verifier) Verify(m *Message, now time.Time) Drop {
	if v == nil {
		return Accepted
	}
	id := m.Signer
	switch {
	case id.Role == Unsigned:
		return DropUnsigned
	case m.Source == SourcePod && (id.Role != SignerRelay || id.Cluster != m.From.Cluster()),
		m.Source == SourceProbe && (id.Role != SignerSignaling || id.Cluster != 0):
		return DropWrongRole
	}
	key := v.Key(id)
	if key == nil {
		return DropUnknown
	}
	if ed25519.VerifyWithOptions(key, m.signed, m.sig, &ed25519.Options{Context: SignContext}) != nil {
		return DropSignature
	}
	if age := now.Unix() - int64(m.Time); age > int64(MessageMaxAge/time.Second) || age < -int64(messageSkew/time.Second) {
		return DropStale
	}
	return Accepted
}
