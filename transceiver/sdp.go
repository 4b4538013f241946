package transceiver

// The answer the pod gives: its candidates rewritten to the POPs'
// addresses and priorities, the Opus rate capped at the backend's, and the
// client's ICE credentials read from the offer.

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rtcedge/rtcedge/transceiver/podnet"
)

// hostPriority is Pion's priority for a host candidate (type preference 126,
// local preference 65535, component 1): the nearest POP's UDP candidate.
const hostPriority = 126<<24 | 65535<<8 | 255

// tcpHostPriority is the priority of the nearest POP's passive TCP
// candidate: the local preference one step below the last UDP rank.
const tcpHostPriority = hostPriority - maxPOPs*256*256

// backupPriority is the priority of the first backup POP's UDP candidate:
// type preference 85, between the two TCP candidates a libwebrtc client
// (Chromium, Safari) pairs with ours: its host candidate (type preference
// 90) and the peer-reflexive one (80) a TCP pair takes once connected. A
// pair's priority is ruled by the lower of its two candidates' (RFC 8445
// section 6.1.2.3), so
//
//   - a not yet connected TCP pair to the nearest POP ranks above the
//     backups' pairs: with UDP dropped, Chromium, checking one pair per
//     pacing interval (about 50 ms) in priority order, checks it right
//     after the nearest POP's UDP pair instead of after the backups'
//     (docs/tcp.md, "Setup time");
//   - once that pair is selected (and peer-reflexive), the backups' pairs
//     rank above it, so Chromium still checks them rather than pruning
//     them unchecked — which would leave no pair to fail over to. Below 80
//     (measured at 60) the backups were pruned and the call died with the
//     nearest POP.
//
// The nearest POP's UDP pair ranks above all, for every client (Pion's TCP
// candidates are at 126).
const backupPriority = 85<<24 | 65535<<8 | 255

// candidatePriority is the priority of a POP's candidate by the POP's rank
// (0: nearest) and transport. Ranks step the local preference by 256 (RFC
// 8445 section 5.1.2), a backup's TCP candidate below every backup's UDP.
func candidatePriority(rank int, tcp bool) int {
	switch {
	case rank == 0 && !tcp:
		return hostPriority
	case rank == 0:
		return tcpHostPriority
	case !tcp:
		return backupPriority - (rank-1)*256*256
	default:
		return backupPriority - maxPOPs*256*256 - (rank-1)*256*256
	}
}

// shapeAnswer sets the candidate priorities by POP rank: the nearest POP's
// UDP candidate first, then its passive TCP candidate (setupTCP), then every
// backup POP's UDP candidate and last every backup's TCP candidate. So UDP
// to the nearest POP wins wherever it works, TCP is tried through the
// nearest POP first, and a backup POP is used only when the nearest fails.
func shapeAnswer(sdp string, pops []POPAddr) (string, error) {
	rank := make(map[netip.AddrPort]int, len(pops))
	tcpRank := make(map[netip.AddrPort]int, len(pops))
	for i, p := range pops {
		rank[p.VIP] = i
		if p.TCPPort != 0 {
			tcpRank[netip.AddrPortFrom(p.VIP.Addr().Unmap(), p.TCPPort)] = i
		}
	}
	lines := strings.Split(sdp, "\r\n")
	found := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "a=candidate:") {
			continue
		}
		f := strings.Fields(l)
		// a=candidate:<foundation> <component> <transport> <priority> <ip> <port> typ <type> ...
		if len(f) < 8 {
			continue
		}
		port, err := strconv.ParseUint(f[5], 10, 16)
		if err != nil {
			continue
		}
		ip, err := netip.ParseAddr(f[4])
		if err != nil {
			continue
		}
		at := netip.AddrPortFrom(ip.Unmap(), uint16(port))
		var prio int
		if strings.EqualFold(f[2], "tcp") { // ICE-TCP, RFC 6544
			r, ok := tcpRank[at]
			if !ok {
				return "", fmt.Errorf("answer has a TCP candidate %s:%s that is not a requested POP's TCP port", f[4], f[5])
			}
			prio = candidatePriority(r, true)
		} else {
			r, ok := rank[at]
			if !ok {
				return "", fmt.Errorf("answer has a candidate %s:%s that is not a requested VIP", f[4], f[5])
			}
			prio = candidatePriority(r, false)
		}
		found++
		f[3] = strconv.Itoa(prio)
		lines[i] = strings.Join(f, " ")
	}
	if found == 0 {
		return "", fmt.Errorf("answer has no candidates")
	}
	return strings.Join(lines, "\r\n"), nil
}

// limitOpusRate sets maxplaybackrate=rate (RFC 7587 section 6.1) on every
// Opus payload type of an answer, when rate is below Opus's 48 kHz: the
// caller's encoder then codes no audio above what a backend that decodes
// at rate keeps (backend.InputRater). libwebrtc maps it to the encoder's
// maximum bandwidth: super-wideband (12 kHz of audio) up to 24 kHz,
// wideband (8 kHz, SILK only) up to 16 kHz.
func limitOpusRate(sdp string, rate int) string {
	if rate <= 0 || rate >= 48000 {
		return sdp
	}
	lines := strings.Split(sdp, "\r\n")
	opusPT := map[string]bool{}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "a=rtpmap:"); ok {
			if pt, codec, ok := strings.Cut(v, " "); ok && strings.HasPrefix(strings.ToLower(codec), "opus/") {
				opusPT[pt] = true
			}
		}
	}
	param := "maxplaybackrate=" + strconv.Itoa(rate)
	out := make([]string, 0, len(lines)+len(opusPT))
	withFmtp := map[string]bool{}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "a=fmtp:"); ok {
			if pt, params, _ := strings.Cut(v, " "); opusPT[pt] {
				kept := []string{}
				for p := range strings.SplitSeq(params, ";") {
					if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(strings.ToLower(p), "maxplaybackrate=") {
						kept = append(kept, p)
					}
				}
				l = "a=fmtp:" + pt + " " + strings.Join(append(kept, param), ";")
				withFmtp[pt] = true
			}
		}
		out = append(out, l)
	}
	// An Opus payload type without an fmtp line gets one after its rtpmap.
	for i := 0; i < len(out); i++ {
		if v, ok := strings.CutPrefix(out[i], "a=rtpmap:"); ok {
			if pt, _, _ := strings.Cut(v, " "); opusPT[pt] && !withFmtp[pt] {
				out = append(out[:i+1], append([]string{"a=fmtp:" + pt + " " + param}, out[i+1:]...)...)
				withFmtp[pt] = true
			}
		}
	}
	return strings.Join(out, "\r\n")
}

// maxClientUfrag bounds the client ufrag the pod accepts, in an offer or
// an ICE restart (RFC 8839 allows 256 characters): it goes into the
// USERNAME of every probe the pod sends the client's addresses, and a
// long one made each probe several times larger than a spoofed packet
// that drew it. Browsers use 4 (Chromium, Safari) or 8 (Firefox)
// characters, Pion 16.
const maxClientUfrag = 32

// iceFragment reads the ICE credentials of an SDP (or SDP fragment): the
// first ice-ufrag and ice-pwd, wherever they appear.
func iceFragment(sdp string) (podnet.Creds, error) {
	var c podnet.Creds
	for line := range strings.Lines(sdp) {
		line = strings.TrimRight(line, "\r\n")
		if v, ok := strings.CutPrefix(line, "a=ice-ufrag:"); ok && c.Ufrag == "" {
			c.Ufrag = v
		} else if v, ok := strings.CutPrefix(line, "a=ice-pwd:"); ok && c.Pwd == "" {
			c.Pwd = v
		}
	}
	// RFC 8839: ufrag 4..256 and pwd 22..256 ice-chars; the ufrag at most
	// maxClientUfrag here.
	switch {
	case len(c.Ufrag) < 4 || len(c.Ufrag) > maxClientUfrag || !iceChars(c.Ufrag):
		return c, fmt.Errorf("%w: missing or invalid a=ice-ufrag", ErrBadFragment)
	case len(c.Pwd) < 22 || len(c.Pwd) > 256 || !iceChars(c.Pwd):
		return c, fmt.Errorf("%w: missing or invalid a=ice-pwd", ErrBadFragment)
	}
	return c, nil
}

func iceChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}
