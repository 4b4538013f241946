// Package keyspec parses the "ID:BASE64" key specs that rtcedge's keyrings
// (routing tokens, inter-tier datagram MACs) are configured with, so that
// every keyring reads keys the same way and no error ever prints a key.
package keyspec

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// Parse parses spec as "ID:BASE64" (standard base64, padding optional): a
// key ID in 0..maxID and a key of exactly keyLen bytes. what names the
// keyring in errors, e.g. "token".
func Parse(what, spec string, maxID uint8, keyLen int) (id uint8, key []byte, err error) {
	idStr, b64, ok := strings.Cut(spec, ":")
	if !ok {
		return 0, nil, fmt.Errorf("%s: key spec %q: want ID:BASE64", what, Redact(spec))
	}
	n, err := strconv.ParseUint(idStr, 10, 8)
	if err != nil || n > uint64(maxID) {
		return 0, nil, fmt.Errorf("%s: key spec: key ID %q not in 0..%d", what, idStr, maxID)
	}
	key, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(b64, "="))
	if err != nil {
		// The error text can quote key material; keep only the fact.
		return 0, nil, fmt.Errorf("%s: key spec for ID %d: key is not valid base64", what, n)
	}
	if len(key) != keyLen {
		return 0, nil, fmt.Errorf("%s: key spec for ID %d: key is %d bytes, want %d", what, n, len(key), keyLen)
	}
	return uint8(n), key, nil
}

// Redact keeps a key spec's ID part only, so that errors never print keys.
func Redact(spec string) string {
	if len(spec) > 3 {
		return spec[:3] + "…"
	}
	return spec
}

// Split splits every element of specs at commas and newlines and drops
// empty ones, so that a config list, an environment variable and a
// mounted file read alike.
func Split(specs ...string) []string {
	var out []string
	for _, e := range specs {
		for _, f := range strings.FieldsFunc(e, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
	}
	return out
}
