package sipfront

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// FuzzCheckOffer: whatever a carrier sends as SDP, checkOffer returns an
// offer or an error (never panics), and an accepted offer's media address
// is one the trunk allows, with a port.
func FuzzCheckOffer(f *testing.F) {
	f.Add([]byte("v=0\r\no=c 1 1 IN IP4 198.51.100.7\r\ns=-\r\nc=IN IP4 198.51.100.7\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0 8 101\r\n"))
	f.Add([]byte("v=0\r\no=c 1 1 IN IP6 2001:db8::7\r\ns=-\r\nt=0 0\r\nm=audio 4000 RTP/AVP 8\r\nc=IN IP6 2001:db8::7\r\nm=video 0 RTP/AVP 96\r\n"))
	f.Add([]byte("v=0\r\nm=audio 1 RTP/AVP 0\r\nm=audio 2 RTP/AVP 0\r\n"))
	f.Add([]byte(""))
	allowed := func(a netip.Addr) bool {
		return netip.MustParsePrefix("198.51.100.0/24").Contains(a.Unmap()) || netip.MustParsePrefix("2001:db8::/32").Contains(a)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := checkOffer(body, allowed)
		if err != nil {
			if offerReason(err) == "" {
				t.Fatalf("error %v has no reason", err)
			}
			return
		}
		if !allowed(o.media.Addr()) || o.media.Port() == 0 {
			t.Fatalf("accepted media %v", o.media)
		}
	})
}

// FuzzCheckDigest: any Authorization value is refused (or challenged)
// unless it carries the trunk's response to a nonce of ours; none panics.
func FuzzCheckDigest(f *testing.F) {
	n, err := newNonces()
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	tr := &trunk{user: "trunk", password: "s3cret"}
	f.Add(`Digest username="trunk", realm="rtcedge", nonce="` + n.issue(now) + `", uri="sip:agent@127.0.0.1", response="00000000000000000000000000000000"`)
	f.Add(`Digest username="trunk"`)
	f.Add(`Basic dHJ1bms6czNjcmV0`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, auth string) {
		if err := n.checkDigest(tr, auth, "INVITE", "sip:agent@127.0.0.1", now); err == nil {
			t.Fatalf("accepted %q", auth)
		}
		_ = n.valid(auth, now)
	})
}

// FuzzSipfragStatus: whatever a carrier's NOTIFY carries, sipfragStatus
// never panics and returns only a SIP status.
func FuzzSipfragStatus(f *testing.F) {
	for _, s := range []string{"SIP/2.0 200 OK\r\n", "SIP/2.0 100 Trying", "SIP/2.0 -1 x", "", "sip/2.0 603\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if status, ok := sipfragStatus(body); ok != (status != 0) || (ok && (status < 100 || status > 699)) {
			t.Fatalf("sipfragStatus(%q) = %d, %v", body, status, ok)
		}
	})
}

// FuzzCheckTarget: a target_uri the API takes can never break out of the
// Refer-To header it goes into.
func FuzzCheckTarget(f *testing.F) {
	for _, s := range []string{"sip:desk@example.com", "tel:+15551234567", "sips:a@b;transport=tls", "sip:a@b>\r\nX: y", "sip:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		if checkTarget(target) == nil && (strings.ContainsAny(target, "\r\n<>\x00") || len(target) > maxTargetURI) {
			t.Fatalf("checkTarget took %q", target)
		}
	})
}
