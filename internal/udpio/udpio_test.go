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
