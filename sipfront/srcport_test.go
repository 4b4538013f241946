package sipfront_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/sipfront"
)

// TestAnswersFromTheListener: a UDP request is answered from the port it
// was sent to (RFC 3261 18.2.2), which carriers' firewalls and NATs expect;
// a connected socket hears nothing from anywhere else.
func TestAnswersFromTheListener(t *testing.T) {
	w := newWorld(t, sipfront.Config{})
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(w.udp))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i, method := range []string{"OPTIONS", "BYE"} {
		msg := method + " sip:agent@" + w.udp.String() + " SIP/2.0\r\nVia: SIP/2.0/UDP " + conn.LocalAddr().String() + ";branch=z9hG4bK-src" + string(rune('a'+i)) +
			"\r\nFrom: <sip:c@127.0.0.1>;tag=1\r\nTo: <sip:agent@127.0.0.1>;tag=2\r\nCall-ID: src-" + method + "\r\nCSeq: 1 " + method + "\r\nContent-Length: 0\r\n\r\n"
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("%s: no answer from the listener's port: %v", method, err)
		}
		if !strings.HasPrefix(string(buf[:n]), "SIP/2.0 ") {
			t.Fatalf("%s: %q", method, buf[:n])
		}
	}
}
