package transceiver

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/testsdp"
)

// testHop is the inter-tier key of cluster 7, the tests' cluster.
var testHop = func() *encap.Keyring {
	k, err := encap.NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{7}, encap.KeyLen)})
	if err != nil {
		panic(err)
	}
	return k
}()

// sealed returns h and payload sealed with testHop, as a cluster relay
// forwards it.
func sealed(t testing.TB, h encap.Header, payload string) []byte {
	t.Helper()
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	hl := len(b)
	b = append(b, payload...)
	testHop.Seal(b, hl)
	return b
}

func udp4(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var unitRelay = netip.MustParseAddrPort("127.0.0.1:9")

func clientHeader(client netip.AddrPort) encap.Header {
	return encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: client, Ingress: netip.MustParseAddrPort("127.0.0.1:8")}
}

var (
	ufragRE = regexp.MustCompile(`a=ice-ufrag:(\S+)`)
	pwdRE   = regexp.MustCompile(`a=ice-pwd:(\S+)`)
)

// TestSpoofedCheckStartsNoDTLS: one Binding Request from a spoofed client
// address, carrying valid credentials of a session (the spoofer's own),
// gets its STUN answer, the pod's one return-routability probe and the
// start of the DTLS handshake, and all of it together is no more than 3
// times the bytes the spoofed source sent (the anti-amplification budget,
// RFC 9000 section 8); no media goes there, and a forged answer to the
// probe does not lift the budget. The handshake starts on the first check
// (it used to wait for the proof, which cost a browser a round trip);
// the real owner of the address answers the probe (with the client's ICE
// password) and the handshake goes on unbounded.
func TestSpoofedCheckStartsNoDTLS(t *testing.T) {
	p := newPod(t, Config{})
	offer := testsdp.Offer(t)
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: offer, POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.t.EndSession(res.ID)
	cu, cpwd := ufragRE.FindStringSubmatch(offer), pwdRE.FindStringSubmatch(offer)
	su, spwd := ufragRE.FindStringSubmatch(res.Answer), pwdRE.FindStringSubmatch(res.Answer)
	if cu == nil || cpwd == nil || su == nil || spwd == nil {
		t.Fatal("no ICE credentials in offer/answer")
	}
	relay := udp4(t)
	defer relay.Close()
	spoofed := netip.MustParseAddrPort("198.51.100.34:6000")
	sentBySpoofer := 0
	send := func(payload []byte) {
		sentBySpoofer += len(payload)
		h := clientHeader(spoofed)
		h.Ingress = relay.LocalAddr().(*net.UDPAddr).AddrPort()
		if _, err := relay.WriteToUDPAddrPort(sealed(t, h, string(payload)), p.addr); err != nil {
			t.Fatal(err)
		}
	}
	check := func() {
		m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(su[1]+":"+cu[1]),
			ice.PriorityAttr(1<<24), ice.AttrControlling(42),
			stun.NewShortTermIntegrity(spwd[1]), stun.Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		send(m.Raw)
	}
	// read returns what the pod sends toward the spoofed address within d:
	// STUN messages, the count of DTLS datagrams and the payload bytes.
	sentToSpoofed := 0
	read := func(d time.Duration) (msgs []*stun.Message, dtlsN int) {
		buf := make([]byte, 2048)
		deadline := time.Now().Add(d)
		for {
			_ = relay.SetReadDeadline(deadline)
			n, _, err := relay.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			h, hl, err := encap.Decode(buf[:n])
			if err != nil || testHop.Verify(buf[:n], hl) != nil || h.Client != spoofed || !h.ToClient {
				t.Fatalf("pod sent something unexpected: %x", buf[:n])
			}
			sentToSpoofed += n - hl
			switch c := buf[hl]; {
			case c < 4:
				m := &stun.Message{Raw: append([]byte(nil), buf[hl:n]...)}
				if err := m.Decode(); err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, m)
			case c >= 20 && c <= 63:
				dtlsN++
			case c >= 128 && c <= 191:
				t.Fatalf("media toward an unproven address: %x", buf[hl:n])
			}
		}
	}
	check()
	msgs, dtlsN := read(1500 * time.Millisecond)
	var probe *stun.Message
	for _, m := range msgs {
		if m.Type == stun.BindingRequest {
			probe = m
		}
	}
	if len(msgs) != 2 || probe == nil || dtlsN == 0 || sentToSpoofed > 3*sentBySpoofer {
		t.Fatalf("after one spoofed check of %d bytes the pod sent %d bytes: %d STUN (probe %v) and %d DTLS datagrams; "+
			"want the answer, one probe and the first DTLS flight, at most 3 times the check", sentBySpoofer, sentToSpoofed, len(msgs), probe != nil, dtlsN)
	}
	t.Logf("one check of %d bytes: %d bytes toward the spoofed address (%d DTLS datagrams)", sentBySpoofer, sentToSpoofed, dtlsN)
	var user stun.Username
	if err := user.GetFrom(probe); err != nil || user.String() != cu[1]+":"+su[1] || stun.NewShortTermIntegrity(cpwd[1]).Check(probe) != nil {
		t.Fatalf("the probe is not a check with the client's credentials: %v %q", err, user.String())
	}
	answer := func(pwd string) {
		m, err := stun.Build(probe, stun.BindingSuccess, &stun.XORMappedAddress{IP: net.IPv4(127, 0, 0, 2), Port: 3478},
			stun.NewShortTermIntegrity(pwd), stun.Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		send(m.Raw)
	}
	answer("a-guess-at-the-clients-password") // a spoofer cannot compute the answer
	read(1500 * time.Millisecond)             // Pion's first retransmission, if the budget allows it
	if sentToSpoofed > 3*sentBySpoofer {
		t.Fatalf("after a forged answer the pod sent %d bytes toward the spoofed address, which sent %d", sentToSpoofed, sentBySpoofer)
	}
	answer(cpwd[1]) // the real owner of the address
	if _, d := read(3 * time.Second); d == 0 {
		t.Fatal("no DTLS after the probe's true answer: the test cannot tell the difference")
	}
}
