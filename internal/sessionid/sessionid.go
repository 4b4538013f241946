// Package sessionid mints and parses the public session identifiers that
// signaling returns in the Location header.
//
// Signaling is stateless, so a DELETE of /v1/realtime/sessions/{id} must be
// routable from the identifier alone: the ID carries the cluster and pod that
// own the session, plus 96 random bits that make it unguessable. It is not a
// credential by itself; signaling still checks the caller's credentials.
package sessionid

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Prefix starts every session ID so that IDs are recognisable in logs.
const Prefix = "rtc_"

const rawLen = 16

// encodedLen is the length of an ID including its prefix.
var encodedLen = len(Prefix) + base64.RawURLEncoding.EncodedLen(rawLen)

// ErrMalformed is returned by Parse for anything that is not a session ID.
var ErrMalformed = errors.New("malformed session id")

// ID identifies one session and where it lives.
type ID struct {
	Cluster uint16
	Pod     uint16
	Random  [12]byte
}

// New returns a fresh ID for a session on (cluster, pod).
func New(cluster, pod uint16) (ID, error) {
	id := ID{Cluster: cluster, Pod: pod}
	if _, err := rand.Read(id.Random[:]); err != nil {
		return ID{}, fmt.Errorf("session id: %w", err)
	}
	return id, nil
}

// String encodes the ID as "rtc_" followed by 22 base64url characters.
func (id ID) String() string {
	var raw [rawLen]byte
	binary.BigEndian.PutUint16(raw[0:], id.Cluster)
	binary.BigEndian.PutUint16(raw[2:], id.Pod)
	copy(raw[4:], id.Random[:])
	return Prefix + base64.RawURLEncoding.EncodeToString(raw[:])
}

// Parse decodes an ID produced by String.
func Parse(s string) (ID, error) {
	if len(s) != encodedLen || !strings.HasPrefix(s, Prefix) {
		return ID{}, ErrMalformed
	}
	var raw [rawLen]byte
	n, err := base64.RawURLEncoding.Decode(raw[:], []byte(s[len(Prefix):]))
	if err != nil || n != rawLen {
		return ID{}, ErrMalformed
	}
	id := ID{Cluster: binary.BigEndian.Uint16(raw[0:]), Pod: binary.BigEndian.Uint16(raw[2:])}
	copy(id.Random[:], raw[4:])
	if id.Cluster == 0 || id.String() != s {
		return ID{}, ErrMalformed
	}
	return id, nil
}
