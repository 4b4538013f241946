package fastpath

// Go views of the maps the programs share with user space. The generated
// fastpath* structs mirror bpf/fastpath.h field for field (TestLayout
// checks them against the C types' BTF and the header against
// internal/encap); the exported types here are what the relays use.

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// Reason is a verdict of a program, indexing its counters: the first
// four are forwards, the rest why a datagram went up to user space.
type Reason uint32

// NumReasons is the number of verdicts (FP_NREASONS in fastpath.h).
const NumReasons = 37

// Reasons holds the label of every Reason, in the order of enum fp_reason.
var Reasons = [NumReasons]string{
	"forward_up", "forward_down", "forward_pod", "forward_client",
	"not_ipv4", "ip_options", "fragment", "not_udp", "not_ours", "short", "miss", "stun", "class",
	"ssrc", "refresh", "empty", "oversize", "mtu", "probe", "bundle", "header", "key", "tag",
	"direction", "pop", "not_from_cluster", "tcp", "flow_mismatch", "wrong_cluster", "unknown_pod",
	"not_from_pod", "pod_mismatch", "ingress", "unknown_ingress", "fib", "adjust", "csum",
}

// The forwards; every other Reason is a pass.
const (
	ForwardUp     Reason = iota // global relay: client → cluster relay
	ForwardDown                 // global relay: cluster relay → client
	ForwardPod                  // cluster relay: → pod
	ForwardClient               // cluster relay: → global relay ingress
)

// ReasonNamed returns the Reason whose label is l.
func ReasonNamed(l string) (Reason, bool) {
	for i, s := range Reasons {
		if s == l {
			return Reason(i), true
		}
	}
	return 0, false
}

// Forwarded reports whether r is a forward rather than a pass.
func (r Reason) Forwarded() bool { return r < 4 }

// Count is what a program counted for one reason, summed over CPUs.
type Count struct {
	Packets, Bytes uint64
}

// signedLen is the header v2 with IPv4 addresses up to its tag.
const signedLen = encap.MinLen - encap.TagLen

// addr4 converts an address the programs can carry.
func addr4(a netip.AddrPort) (fastpathFpAddr4, error) {
	ip := a.Addr().Unmap()
	if !ip.Is4() {
		return fastpathFpAddr4{}, fmt.Errorf("%v: %w", a, ErrNotIPv4)
	}
	b := ip.As4()
	var p [2]byte
	binary.BigEndian.PutUint16(p[:], a.Port())
	// The programs compare these with packet bytes: store them so that
	// their bytes in memory are in network order.
	return fastpathFpAddr4{Ip: binary.NativeEndian.Uint32(b[:]), Port: binary.NativeEndian.Uint16(p[:])}, nil
}

// addrPort converts back.
func (a fastpathFpAddr4) addrPort() netip.AddrPort {
	var b [4]byte
	var p [2]byte
	binary.NativeEndian.PutUint32(b[:], a.Ip)
	binary.NativeEndian.PutUint16(p[:], a.Port)
	return netip.AddrPortFrom(netip.AddrFrom4(b), binary.BigEndian.Uint16(p[:]))
}

// splitKey reads a hop key as internal/encap does: two little-endian halves.
func splitKey(k [encap.KeyLen]byte) fastpathFpKey {
	return fastpathFpKey{K0: binary.LittleEndian.Uint64(k[:8]), K1: binary.LittleEndian.Uint64(k[8:])}
}

// GlobalFlow is what a global relay installs for a flow it has
// authenticated: the kernel then forwards the flow's DTLS and RTP/RTCP
// with this header, sealed under Key, until RefreshAt.
type GlobalFlow struct {
	// Client is the client's address, VIP the public socket it sends to
	// (where replies leave from).
	Client, VIP netip.AddrPort
	// Relay is the flow's cluster relay.
	Relay netip.AddrPort
	// Header is the header toward the transceiver (ToClient false; its
	// Ingress is the worker's internal socket, the source of what the
	// kernel sends). KeyID is the ID Key has.
	Header encap.Header
	// Key seals the header (encap.Keyring.SealKey).
	Key [encap.KeyLen]byte
	// SSRC is the client's RTP SSRC user space has noted; RTP with
	// another SSRC goes up. HasSSRC false: any RTP goes up.
	SSRC    uint32
	HasSSRC bool
	// RefreshAt is the Monotonic time from which the flow's datagrams go
	// up again (route-cache refresh, relay choice): user space then
	// installs the flow anew.
	RefreshAt uint64
}

// FlowStats is what the kernel has counted for a flow since it was
// installed.
type FlowStats struct {
	// LastSeen and LastReply are Monotonic times of the last datagram
	// forwarded from the client and to it; 0: none.
	LastSeen, LastReply uint64
	// ReplyRelay is the cluster relay of the last reply forwarded.
	ReplyRelay             netip.AddrPort
	UpPackets, UpBytes     uint64
	DownPackets, DownBytes uint64
}

func (f *GlobalFlow) key() (fastpathGrFlowKey, error) {
	c, err := addr4(f.Client)
	if err != nil {
		return fastpathGrFlowKey{}, err
	}
	v, err := addr4(f.VIP)
	if err != nil {
		return fastpathGrFlowKey{}, err
	}
	return fastpathGrFlowKey{ClientIp: c.Ip, VipIp: v.Ip, ClientPort: c.Port, VipPort: v.Port}, nil
}

// value lays the flow out for the map (counters zero).
func (f *GlobalFlow) value() (fastpathGrFlow, error) {
	var v fastpathGrFlow
	relay, err := addr4(f.Relay)
	if err != nil {
		return v, err
	}
	h := f.Header
	h.ToClient = false
	var b [encap.MaxLen]byte
	n, err := h.Put(b[:])
	if err != nil {
		return v, fmt.Errorf("fastpath: flow header: %w", err)
	}
	if n != encap.MinLen {
		return v, fmt.Errorf("fastpath: flow header: %w", ErrNotIPv4)
	}
	copy(v.Hdr[:], b[:signedLen])
	v.Seal = splitKey(f.Key)
	v.RefreshNs = f.RefreshAt
	v.Relay = relay
	v.Ssrc = f.SSRC
	if f.HasSSRC {
		v.HasSsrc = 1
	}
	return v, nil
}

func (v *fastpathGrFlow) stats() FlowStats {
	return FlowStats{LastSeen: v.LastSeenNs, LastReply: v.LastReplyNs, ReplyRelay: v.ReplyRelay.addrPort(),
		UpPackets: v.UpPackets, UpBytes: v.UpBytes, DownPackets: v.DownPackets, DownBytes: v.DownBytes}
}
