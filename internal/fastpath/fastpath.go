// Package fastpath holds rtcedge's kernel programs and their loader: the
// relays' in-kernel fast path (docs/fastpath.md), TC programs written in C
// (bpf/fastpath.c, compiled by bpf2go into the committed objects) that
// forward the established flows user space has authenticated and pass
// every other datagram up unchanged.
//
// User space stays the one authority. A global relay installs a flow
// (Global.Install) after the flow's first authenticated datagram and
// removes it on expiry; the kernel forwards the flow's DTLS and RTP/RTCP,
// sealing header v2 itself, and its replies, verifying their tags. A
// cluster relay pushes its pod directory and keys (Cluster); the kernel
// forwards what verifies. Anything the programs are not sure of — a miss,
// a bad tag, STUN, a bundle, a probe, an oversize datagram, IP options,
// fragments, TCP, IPv6 — goes up, counted by reason (Reasons).
//
// The package imports neither relay: they push their flows, directories
// and keys into it.
package fastpath

import (
	"errors"
	"fmt"
	"strings"
)

// Mode says whether and how a relay attaches its fast path.
type Mode string

// Modes of the `fast_path` config key.
const (
	// ModeAuto attaches with TCX where the kernel allows it and otherwise
	// stays in user space, with one log line and a metric.
	ModeAuto Mode = "auto"
	// ModeTC attaches with TCX or fails.
	ModeTC Mode = "tc"
	// ModeXDP asks for native XDP. The programs are TC programs for now
	// (they push and pop the header with bpf_skb_adjust_room and fix
	// checksums with the skb helpers), so it fails with ErrXDP.
	ModeXDP Mode = "xdp"
	// ModeOff keeps every datagram in user space.
	ModeOff Mode = "off"
)

// ParseMode reads a `fast_path` value; empty is ModeAuto.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return ModeAuto, nil
	case ModeAuto, ModeTC, ModeXDP, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("fast_path %q: want auto, tc, xdp or off", s)
}

var (
	// ErrUnavailable means the kernel refused to load or attach the
	// programs (no CAP_BPF, an old kernel, an unsupported device): the
	// relay runs in user space alone.
	ErrUnavailable = errors.New("fastpath: kernel fast path unavailable")
	// ErrXDP means native XDP was asked for: the programs are TC only.
	ErrXDP = errors.New("fastpath: no XDP program (the fast path attaches with TCX)")
	// ErrNotIPv4 means a flow or address the programs do not handle:
	// they forward IPv4 only, and such a flow stays in user space.
	ErrNotIPv4 = errors.New("fastpath: not an IPv4 address")
)

// Start attaches a relay's fast path as mode says: ModeOff attaches
// nothing; ModeAuto falls back to user space when attach fails, calling
// unavailable with the reason (the relay's one log line and metric) and
// returning the zero K; tc and xdp return attach's error. Both relays
// start their fast paths through it, so the fallback rule is one.
func Start[K any](mode Mode, attach func(Mode) (K, error), unavailable func(error)) (K, error) {
	var zero K
	if mode == ModeOff {
		return zero, nil
	}
	k, err := attach(mode)
	if err != nil {
		if mode != ModeAuto {
			return zero, err
		}
		unavailable(err)
		return zero, nil
	}
	return k, nil
}
