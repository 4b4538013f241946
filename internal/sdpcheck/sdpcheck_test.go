package sdpcheck

import (
	"strings"
	"testing"
)

const good = "v=0\r\n" +
	"o=- 1 2 IN IP4 127.0.0.1\r\n" +
	"s=-\r\n" +
	"t=0 0\r\n" +
	"a=group:BUNDLE 0\r\n" +
	"a=fingerprint:sha-256 AA:BB\r\n" +
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
		{"no fingerprint", strings.Replace(good, "a=fingerprint:sha-256 AA:BB\r\n", "", 1), CodeNoFingerprint},
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
