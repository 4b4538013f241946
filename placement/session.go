// The session merge: what config a call's backend gets, from the server's
// (a client secret's, a SIP trunk's) and the caller's.

package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// MaxSessionJSON caps a session config, in bytes of JSON.
const MaxSessionJSON = 32 << 10

// FieldError names a caller's session field that may not be set.
type FieldError struct{ Field string }

func (e *FieldError) Error() string {
	return fmt.Sprintf("session.%s is fixed by the server that minted the client secret", e.Field)
}

// CanonicalSession checks that a session is a JSON object of bounded size
// and returns it compacted with its keys sorted (so equal configs encode
// equally), or nil for an absent or empty one.
func CanonicalSession(raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, nil
	}
	if len(raw) > MaxSessionJSON {
		return nil, fmt.Errorf("the session is over %d bytes", MaxSessionJSON)
	}
	obj, err := DecodeObject(raw)
	if err != nil || obj == nil {
		return nil, errors.New("the session must be a JSON object")
	}
	if len(obj) == 0 {
		return nil, nil
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode session: %w", err)
	}
	return out, nil
}

// MergeSession lays the server's session over the client's: the server's
// fields always win (objects are merged key by key, the server's keys
// winning), the client adds only the fields its policy allows, and a
// client field off that list is refused unless it repeats the server's
// value (dropped silently with the policy's SealedWins). Both inputs are
// JSON objects or empty; the result is canonical. A refused field is a
// *FieldError.
func MergeSession(server, client json.RawMessage, p sessionapi.Caller) (json.RawMessage, error) {
	var s, c map[string]any
	var err error
	if len(server) > 0 {
		if s, err = DecodeObject(server); err != nil {
			return nil, fmt.Errorf("server session: %w", err)
		}
	}
	if len(client) > 0 {
		if c, err = DecodeObject(client); err != nil {
			return nil, errors.New("the session must be a JSON object")
		}
	}
	if s == nil {
		s = map[string]any{}
	}
	for k, cv := range c {
		sv, fixed := s[k]
		if !slices.Contains(p.SessionFields, k) {
			if p.SealedWins || (fixed && jsonEqual(sv, cv)) {
				continue
			}
			return nil, &FieldError{Field: k}
		}
		if fixed {
			s[k] = overlay(sv, cv)
		} else {
			s[k] = cv
		}
	}
	if len(s) == 0 {
		return nil, nil
	}
	return json.Marshal(s)
}

// DecodeObject decodes a JSON object keeping numbers as written (a token
// limit of 4096 stays 4096, not 4096.0 or a rounded float), and refuses
// trailing data.
func DecodeObject(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("data after the session object")
	}
	return obj, nil
}

// overlay merges two JSON values with top's winning: objects key by key,
// anything else top as it is.
func overlay(top, under any) any {
	t, ok1 := top.(map[string]any)
	u, ok2 := under.(map[string]any)
	if !ok1 || !ok2 {
		return top
	}
	out := make(map[string]any, len(t)+len(u))
	for k, v := range u {
		out[k] = v
	}
	for k, v := range t {
		if uv, ok := u[k]; ok {
			out[k] = overlay(v, uv)
		} else {
			out[k] = v
		}
	}
	return out
}

func jsonEqual(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}
