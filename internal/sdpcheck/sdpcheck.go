// Package sdpcheck validates SDP offers before anything is allocated for a
// session. Signaling runs it to answer bad requests with a precise 400, and
// the transceiver runs it again because its session API is a trust boundary
// of its own.
package sdpcheck

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pion/sdp/v3"
)

// MaxMediaSections bounds the work one offer can cause.
const MaxMediaSections = 16

// Error is a validation failure. Code is a stable machine-readable value
// used in API error bodies ("invalid_sdp", "no_audio", ...).
type Error struct {
	Code string
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Codes returned in Error.Code.
const (
	CodeInvalidSDP     = "invalid_sdp"
	CodeNotOffer       = "not_an_offer"
	CodeNoAudio        = "no_audio"
	CodeNoOpus         = "no_opus"
	CodeNoICECreds     = "missing_ice_credentials"
	CodeNoFingerprint  = "missing_fingerprint"
	CodeBadFingerprint = "invalid_fingerprint"
	CodeNotSecure      = "insecure_profile"
	CodeTooManySection = "too_many_media_sections"
)

func fail(code, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf returns the Error code of err, or "" when err is not an *Error.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Offer checks that raw is an SDP offer rtcedge can answer: it parses, has at
// most MaxMediaSections media sections, an audio section offering Opus, ICE
// credentials and a DTLS fingerprint (at session or media level).
func Offer(raw string) error {
	if strings.TrimSpace(raw) == "" {
		return fail(CodeInvalidSDP, "empty SDP")
	}
	var d sdp.SessionDescription
	if err := d.UnmarshalString(raw); err != nil {
		return fail(CodeInvalidSDP, "SDP does not parse: %v", err)
	}
	if len(d.MediaDescriptions) > MaxMediaSections {
		return fail(CodeTooManySection, "SDP has %d media sections, at most %d are accepted",
			len(d.MediaDescriptions), MaxMediaSections)
	}
	_, sessUfrag := d.Attribute("ice-ufrag")
	_, sessPwd := d.Attribute("ice-pwd")
	_, sessFP := d.Attribute("fingerprint")

	sessFPValue, _ := d.Attribute("fingerprint")

	audio, opus := false, false
	for _, m := range d.MediaDescriptions {
		if m.MediaName.Media != "audio" || m.MediaName.Port.Value == 0 {
			continue // port 0: a section the offerer rejected
		}
		audio = true
		if !hasOpus(m) {
			continue
		}
		opus = true
		_, ufrag := m.Attribute("ice-ufrag")
		_, pwd := m.Attribute("ice-pwd")
		fpValue, fp := m.Attribute("fingerprint")
		if !(ufrag || sessUfrag) || !(pwd || sessPwd) {
			return fail(CodeNoICECreds, "audio section lacks a=ice-ufrag or a=ice-pwd")
		}
		if !(fp || sessFP) {
			return fail(CodeNoFingerprint, "audio section lacks a=fingerprint (DTLS is required)")
		}
		if !fp {
			fpValue = sessFPValue
		}
		if err := checkFingerprint(fpValue); err != nil {
			return err
		}
		if !secureProfile(m.MediaName.Protos) {
			return fail(CodeNotSecure, "audio section's profile %s is not DTLS-SRTP (UDP/TLS/RTP/SAVPF)", strings.Join(m.MediaName.Protos, "/"))
		}
	}
	switch {
	case !audio:
		return fail(CodeNoAudio, "SDP has no audio section")
	case !opus:
		return fail(CodeNoOpus, "no audio section offers Opus")
	}
	return nil
}

// fingerprintLen is the digest length, in bytes, of each hash a DTLS
// fingerprint may use (RFC 8122).
var fingerprintLen = map[string]int{"sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64}

// checkFingerprint checks an a=fingerprint value: a known hash and its
// digest as colon-separated hex bytes. An offer with anything else can
// never complete DTLS, and would hold a pod's slot until it times out.
func checkFingerprint(v string) error {
	hash, digest, ok := strings.Cut(strings.TrimSpace(v), " ")
	n, known := fingerprintLen[strings.ToLower(hash)]
	if !ok || !known {
		return fail(CodeBadFingerprint, "a=fingerprint hash %q is not one of sha-1, sha-224, sha-256, sha-384, sha-512", hash)
	}
	parts := strings.Split(strings.TrimSpace(digest), ":")
	if len(parts) != n {
		return fail(CodeBadFingerprint, "a=fingerprint %s digest has %d bytes, want %d", hash, len(parts), n)
	}
	for _, p := range parts {
		if len(p) != 2 || !isHex(p[0]) || !isHex(p[1]) {
			return fail(CodeBadFingerprint, "a=fingerprint digest is not colon-separated hex bytes")
		}
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// secureProfile reports whether a media section's transport protocol is
// DTLS-SRTP: UDP/TLS/RTP/SAVP(F), or TCP/DTLS/RTP/SAVPF and the like.
func secureProfile(protos []string) bool {
	var tls, savp bool
	for _, p := range protos {
		switch strings.ToUpper(p) {
		case "TLS", "DTLS":
			tls = true
		case "SAVP", "SAVPF":
			savp = true
		}
	}
	return tls && savp
}

func hasOpus(m *sdp.MediaDescription) bool {
	for _, a := range m.Attributes {
		if a.Key != "rtpmap" {
			continue
		}
		// "111 opus/48000/2"
		_, codec, ok := strings.Cut(a.Value, " ")
		if ok && strings.HasPrefix(strings.ToLower(codec), "opus/") {
			return true
		}
	}
	return false
}
