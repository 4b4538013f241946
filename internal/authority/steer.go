package authority

import (
	"crypto/ed25519"

	"github.com/rtcedge/rtcedge/internal/steer"
)

// Keys of steering samples messages (internal/steer, wire.go): the same
// role keys that prove global-pool metadata (global.go), so a member
// that signaling refuses as unproven cannot pass samples on either. A
// cluster relay signs its pods' samples with its cluster's relay key
// (SteerAuthority), signaling its probes' with the signaling key; a
// signaling replica verifies with the public keys GlobalCheck uses.
// The signatures are Ed25519ctx and the proofs plain Ed25519, so neither
// passes for the other.

// SteerSigner is signaling's signer of the probe samples it passes on to
// the other replicas: the signaling key under its current ID. nil when s
// holds no signaling secret (the replicas holding keys then drop what it
// passes on, counted as unsigned).
func (s *Secrets) SteerSigner() *steer.Signer {
	sc := scope{kind: kindSignaling}
	ids := s.secretIDs(sc)
	if ids == nil {
		return nil
	}
	return &steer.Signer{ID: steer.SignerID{Role: steer.SignerSignaling, KeyID: ids[0]}, Key: s.signer(sc, ids[0])}
}

// SteerVerifier is a signaling replica's check of samples messages: a
// pod's samples must be signed by a relay key of that pod's cluster, a
// probe's by a signaling key, each one s holds (a secret's public key or
// a public key it was given). A cluster s holds no relay key of is
// unknown: its samples are dropped.
func (s *Secrets) SteerVerifier() *steer.Verifier {
	pubs, _ := s.globalPubs()
	return &steer.Verifier{Key: func(id steer.SignerID) ed25519.PublicKey {
		var sc scope
		switch id.Role {
		case steer.SignerRelay:
			sc = scope{kindRelayPub, id.Cluster}
		case steer.SignerSignaling:
			sc = scope{kind: kindSignalingPub}
		default:
			return nil
		}
		return pubs[sc][id.KeyID]
	}}
}
