package sdpcheck

import (
	"strings"
	"testing"
)

const fp = "sha-256 AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99"

const good = "v=0\r\n" +
	"o=- 1 2 IN IP4 127.0.0.1\r\n" +
	"s=-\r\n" +
	"t=0 0\r\n" +
	"a=group:BUNDLE 0\r\n" +
	"a=fingerprint:" + fp + "\r\n" +
	"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" +
	"c=IN IP4 0.0.0.0\r\n" +
	"a=mid:0\r\n" +
	"a=ice-ufrag:abcd\r\n" +
	"a=ice-pwd:abcdefghijklmnopqrstuvwx\r\n" +
	"a=setup:actpass\r\n" +
	"a=rtpmap:111 opus/48000/2\r\n"

func TestOffer(t *testing.T) {
	tests := []struct {
		name string
		sdp  string
		code string
	}{
		{"good", good, ""},
		{"empty", "", CodeInvalidSDP},
		{"garbage", "hello world", CodeInvalidSDP},
		{"no audio", strings.Replace(good, "m=audio", "m=video", 1), CodeNoAudio},
		{"no opus", strings.Replace(good, "opus/48000/2", "PCMU/8000", 1), CodeNoOpus},
		{"no ufrag", strings.Replace(good, "a=ice-ufrag:abcd\r\n", "", 1), CodeNoICECreds},
		{"no pwd", strings.Replace(good, "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\n", "", 1), CodeNoICECreds},
		{"no fingerprint", strings.Replace(good, "a=fingerprint:"+fp+"\r\n", "", 1), CodeNoFingerprint},
		// Offers that can never complete DTLS-SRTP would hold a pod's slot
		// until they time out.
		{"fingerprint not hex", strings.Replace(good, fp, "sha-256 zz", 1), CodeBadFingerprint},
		{"fingerprint too short", strings.Replace(good, fp, "sha-256 AA:BB", 1), CodeBadFingerprint},
		{"fingerprint of an unknown hash", strings.Replace(good, fp, "md5 AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99", 1), CodeBadFingerprint},
		{"fingerprint in lower case", strings.Replace(good, fp, strings.ToLower(fp), 1), ""},
		{"plain RTP", strings.Replace(good, "UDP/TLS/RTP/SAVPF", "RTP/AVP", 1), CodeNotSecure},
		{"audio rejected (port 0)", strings.Replace(good, "m=audio 9", "m=audio 0", 1), CodeNoAudio},
		{"too many sections", good + strings.Repeat("m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", MaxMediaSections), CodeTooManySection},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Offer(tt.sdp)
			if got := CodeOf(err); got != tt.code {
				t.Fatalf("Offer() = %v (code %q), want code %q", err, got, tt.code)
			}
		})
	}
}

func FuzzOffer(f *testing.F) {
	f.Add(good)
	f.Add("v=0\r\nm=audio")
	f.Fuzz(func(t *testing.T, s string) {
		if err := Offer(s); err != nil && CodeOf(err) == "" {
			t.Fatalf("error without code: %v", err)
		}
	})
}
