package transceiver

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// hostPriority is Pion's priority for a host candidate (type preference 126,
// local preference 65535, component 1). Backup POPs get a lower local
// preference, one step of 256 per rank, so clients use them only when the
// preferred POP fails (RFC 8445 section 5.1.2).
const hostPriority = 126<<24 | 65535<<8 | 255

// tcpHostPriority is the priority of the nearest POP's passive TCP
// candidate: the local preference one step below the last UDP rank, so
// every TCP pair ranks below every UDP pair.
const tcpHostPriority = hostPriority - maxPOPs*256*256

// shapeAnswer lowers the candidate priority of every POP after the first,
// and puts every passive TCP candidate (tcp.go) below every UDP one, in
// the same POP order: UDP wins wherever it works, and TCP is tried through
// the nearest POP first.
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
		if isTCPCandidateLine(f[2]) {
			r, ok := tcpRank[at]
			if !ok {
				return "", fmt.Errorf("answer has a TCP candidate %s:%s that is not a requested POP's TCP port", f[4], f[5])
			}
			prio = tcpHostPriority - r*256*256
		} else {
			r, ok := rank[at]
			if !ok {
				return "", fmt.Errorf("answer has a candidate %s:%s that is not a requested VIP", f[4], f[5])
			}
			prio = hostPriority - r*256*256
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
