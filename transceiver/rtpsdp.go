// A phone call's SDP at the pod: what it reads of a carrier's offer (the
// front checked it first, sipfront/offer.go; the pod checks again what it
// relies on) and the answer it writes, which names the POP's VIP.

package transceiver

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/pion/sdp/v3"

	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// carrierOffer is what the pod takes from a carrier's SDP offer.
type carrierOffer struct {
	media   netip.AddrPort // the carrier's RTP address (symmetric RTP)
	law     g711.Law       // the codec chosen: the carrier's first of PCMU, PCMA
	pt      uint8          // its payload type (static: 0 or 8)
	dtmfPT  int            // telephone-event/8000's payload type, -1 if not offered
	rtcpMux bool           // a=rtcp-mux offered
	ptime   int            // a=ptime, 20 when absent
}

// errCallOffer is every refusal of a carrier offer, wrapped in ErrBadOffer.
var errCallOffer = errors.New("the offer has no audio over RTP/AVP with PCMU or PCMA at a unicast address")

// parseCarrierOffer reads the one audio section of a carrier's offer.
func parseCarrierOffer(offer string) (carrierOffer, error) {
	var sd sdp.SessionDescription
	if err := sd.UnmarshalString(offer); err != nil {
		return carrierOffer{}, fmt.Errorf("%w: %w: %v", ErrBadOffer, errCallOffer, err)
	}
	var audio *sdp.MediaDescription
	for _, m := range sd.MediaDescriptions {
		if m.MediaName.Media == "audio" && m.MediaName.Port.Value != 0 {
			if audio != nil {
				return carrierOffer{}, fmt.Errorf("%w: %w: more than one audio section", ErrBadOffer, errCallOffer)
			}
			audio = m
		}
	}
	if audio == nil || strings.Join(audio.MediaName.Protos, "/") != "RTP/AVP" {
		return carrierOffer{}, fmt.Errorf("%w: %w", ErrBadOffer, errCallOffer)
	}
	o := carrierOffer{dtmfPT: -1, ptime: 20, pt: 255}
	for _, f := range audio.MediaName.Formats {
		if pt, err := strconv.Atoi(f); err == nil && (pt == 0 || pt == 8) && o.pt == 255 {
			o.pt = uint8(pt)
			o.law = g711.PCMU
			if pt == 8 {
				o.law = g711.PCMA
			}
		}
	}
	for _, a := range audio.Attributes {
		switch a.Key {
		case "rtcp-mux":
			o.rtcpMux = true
		case "ptime":
			if v, err := strconv.Atoi(a.Value); err == nil && v >= 10 && v <= 60 {
				o.ptime = v
			}
		case "rtpmap":
			pt, enc, ok := strings.Cut(a.Value, " ")
			if n, err := strconv.Atoi(pt); ok && err == nil && n >= 96 && n <= 127 && strings.EqualFold(enc, "telephone-event/8000") {
				o.dtmfPT = n
			}
		}
	}
	conn := audio.ConnectionInformation
	if conn == nil {
		conn = sd.ConnectionInformation
	}
	if o.pt == 255 || conn == nil || conn.Address == nil || conn.NetworkType != "IN" {
		return carrierOffer{}, fmt.Errorf("%w: %w", ErrBadOffer, errCallOffer)
	}
	addr, err := netip.ParseAddr(conn.Address.Address)
	port := audio.MediaName.Port.Value
	if err != nil || addr.IsUnspecified() || addr.IsMulticast() || port <= 0 || port > 65535 {
		return carrierOffer{}, fmt.Errorf("%w: %w: media address %q", ErrBadOffer, errCallOffer, conn.Address.Address)
	}
	o.media = netip.AddrPortFrom(addr.Unmap(), uint16(port))
	return o, nil
}

// callAnswer is the pod's SDP answer to a carrier: the VIP and port the
// carrier sends to (RTCP on the same port with rtcp-mux, else announced
// there too, RFC 3605), the chosen codec and, when offered, DTMF events.
func callAnswer(id string, vip netip.AddrPort, o carrierOffer) string {
	ipv := "IP4"
	if vip.Addr().Is6() && !vip.Addr().Is4In6() {
		ipv = "IP6"
	}
	addr := vip.Addr().Unmap().String()
	var b strings.Builder
	fmt.Fprintf(&b, "v=0\r\no=rtcedge %d 1 IN %s %s\r\ns=rtcedge\r\nc=IN %s %s\r\nt=0 0\r\n", sessionVersion(id), ipv, addr, ipv, addr)
	fmt.Fprintf(&b, "m=audio %d RTP/AVP %d", vip.Port(), o.pt)
	if o.dtmfPT >= 0 {
		fmt.Fprintf(&b, " %d", o.dtmfPT)
	}
	fmt.Fprintf(&b, "\r\na=rtpmap:%d %s/%d\r\n", o.pt, o.law.Name(), g711.ClockRate)
	if o.dtmfPT >= 0 {
		fmt.Fprintf(&b, "a=rtpmap:%d telephone-event/8000\r\na=fmtp:%d 0-16\r\n", o.dtmfPT, o.dtmfPT)
	}
	if o.rtcpMux {
		b.WriteString("a=rtcp-mux\r\n")
	} else {
		fmt.Fprintf(&b, "a=rtcp:%d\r\n", vip.Port())
	}
	b.WriteString("a=ptime:20\r\na=sendrecv\r\n")
	return b.String()
}

// sessionVersion is the o= line's session ID: digits, from the call's ID.
func sessionVersion(id string) uint32 {
	var h uint32 = 2166136261
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * 16777619
	}
	return h
}
