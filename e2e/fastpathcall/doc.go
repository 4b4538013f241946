// Package fastpathcall holds the end-to-end test of the relays' in-kernel
// fast path (docs/fastpath.md): every role of rtcedge as its own process,
// each on its own host — a network namespace joined to one Ethernet bridge
// by a veth pair (internal/fastpath/fptest.LAN) — and a real Pion call from
// a client host behind a kernel NAT through global relay → cluster relay →
// pod and back, with the relays' fast path off and on. With it on, the
// relays' kernel counters must show the call's media forwarded in the
// kernel, and a NAT rebind and a global relay restart with flows in the
// kernel must behave exactly as with it off: the same bounds, the same
// session, one address change per rebind.
//
// The tests need root (namespaces, BPF) and iproute2, ethtool and nftables;
// they skip saying so without root and fail naming what to install
// otherwise.
package fastpathcall
