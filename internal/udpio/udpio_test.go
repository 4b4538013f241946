package udpio

import (
	"net/netip"
	"testing"
)

// TestListenReusePort: the sockets share one address, and datagrams sent to
// it are delivered to one of them.
func TestListenReusePort(t *testing.T) {
	conns, err := ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	addr := LocalAddrPort(conns[0])
	for _, c := range conns[1:] {
		if LocalAddrPort(c) != addr {
			t.Fatalf("socket on %v, want %v", LocalAddrPort(c), addr)
		}
	}
	if _, err := ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 0); err == nil {
		t.Error("zero sockets accepted")
	}
}

func TestListenWorkerPairs(t *testing.T) {
	pubs, ins, err := ListenWorkerPairs(netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("127.0.0.1:0"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range append(pubs, ins...) {
			c.Close()
		}
	}()
	if len(pubs) != 2 || len(ins) != 2 || LocalAddrPort(pubs[0]) != LocalAddrPort(pubs[1]) || LocalAddrPort(ins[0]) == LocalAddrPort(ins[1]) {
		t.Fatalf("pubs %v ins %v: want one shared public address and two internal ones", pubs, ins)
	}
}
