// The checks of a carrier's SDP offer the front makes before it places a
// call: what it needs to be sure of itself, whatever the SIP parser let
// through.

package sipfront

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/pion/sdp/v3"
)

// maxOffer caps the SDP body of an INVITE.
const maxOffer = 16 << 10

// Offer refusals, each answered 488 Not Acceptable Here and counted under
// its reason.
var (
	errOfferSyntax  = errors.New("the SDP does not parse")
	errOfferNoAudio = errors.New("the SDP has no audio section with a port")
	errOfferCodec   = errors.New("the SDP's audio offers neither PCMU (0) nor PCMA (8) over RTP/AVP")
	errOfferAddress = errors.New("the SDP's media address is not one of the trunk's media addresses")
	errOfferTooMany = errors.New("the SDP has more than one audio section")
)

// offerReason is the metric reason of an offer refusal.
func offerReason(err error) string {
	switch {
	case errors.Is(err, errOfferNoAudio):
		return "offer_no_audio"
	case errors.Is(err, errOfferCodec):
		return "offer_codec"
	case errors.Is(err, errOfferAddress):
		return "offer_address"
	case errors.Is(err, errOfferTooMany):
		return "offer_sections"
	default:
		return "offer_syntax"
	}
}

// offer is what the front reads from a carrier's SDP.
type offer struct {
	media netip.AddrPort // where the carrier receives (and, symmetric, sends) RTP
}

// checkOffer parses a carrier's SDP offer and checks that it has exactly
// one audio section over RTP/AVP offering PCMU or PCMA, at an address the
// trunk's media may be at (allowed). Other media sections are fine: the
// pod's answer refuses them (port 0).
func checkOffer(body []byte, allowed func(netip.Addr) bool) (offer, error) {
	var sd sdp.SessionDescription
	if err := sd.UnmarshalString(string(body)); err != nil {
		return offer{}, fmt.Errorf("%w: %v", errOfferSyntax, err)
	}
	var audio *sdp.MediaDescription
	for _, m := range sd.MediaDescriptions {
		if m.MediaName.Media != "audio" || m.MediaName.Port.Value == 0 {
			continue
		}
		if audio != nil {
			return offer{}, errOfferTooMany
		}
		audio = m
	}
	if audio == nil {
		return offer{}, errOfferNoAudio
	}
	if strings.Join(audio.MediaName.Protos, "/") != "RTP/AVP" || !hasG711(audio.MediaName.Formats) {
		return offer{}, errOfferCodec
	}
	conn := audio.ConnectionInformation
	if conn == nil {
		conn = sd.ConnectionInformation
	}
	if conn == nil || conn.Address == nil || conn.NetworkType != "IN" {
		return offer{}, fmt.Errorf("%w: no connection address", errOfferAddress)
	}
	addr, err := netip.ParseAddr(conn.Address.Address)
	if err != nil || !allowed(addr) {
		return offer{}, fmt.Errorf("%w: %q", errOfferAddress, conn.Address.Address)
	}
	port := audio.MediaName.Port.Value
	if port <= 0 || port > 65535 {
		return offer{}, errOfferNoAudio
	}
	return offer{media: netip.AddrPortFrom(addr.Unmap(), uint16(port))}, nil
}

// hasG711 reports whether formats offer PCMU (0) or PCMA (8).
func hasG711(formats []string) bool {
	for _, f := range formats {
		if pt, err := strconv.Atoi(f); err == nil && (pt == 0 || pt == 8) {
			return true
		}
	}
	return false
}
