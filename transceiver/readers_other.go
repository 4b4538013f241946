//go:build !linux

package transceiver

import (
	"fmt"
	"net"
)

// readerConns returns n conns reading the pod socket: the socket and
// duplicates of its descriptor (no reuseport steering off Linux).
func readerConns(c *net.UDPConn, n int) ([]*net.UDPConn, error) {
	conns := []*net.UDPConn{c}
	for range n - 1 {
		d, err := dupUDP(c)
		if err != nil {
			for _, c := range conns[1:] {
				_ = c.Close()
			}
			return nil, fmt.Errorf("pod socket reader: %w", err)
		}
		conns = append(conns, d)
	}
	return conns, nil
}
