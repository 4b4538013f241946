// The dev world's SIP front: phone calls from softphones on loopback.

package devworld

import (
	"fmt"
	"net"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/sipfront"
)

// startSIP runs the SIP front on cfg.SIPAddr, UDP and TCP on one port
// (with port 0, the UDP socket's port is taken for TCP too). Every
// loopback source is the dev trunk, whose calls get the echo's (empty)
// session config: no webhook, every call accepted.
func (w *World) startSIP() error {
	udp, tcp, err := listenSIP(w.cfg.SIPAddr)
	if err != nil {
		return err
	}
	cfg := sipfront.NodeConfig{
		SIPUDP: udp.LocalAddr().String(), SIPTCP: tcp.Addr().String(),
		CatalogueData: w.Catalogue, GeoIPData: geo.DevGeoIPDB, SessionAPISecrets: w.apiSecrets, SessionAPITLS: w.apiCA,
		Config: sipfront.Config{
			// One softphone or test on loopback is every caller: limits
			// meant for the internet would throttle load tests.
			SourceRate: 10000, SourceBurst: 10000,
			Trunks: []sipfront.Trunk{{Name: "dev", SourceCIDRs: []string{"127.0.0.0/8", "::1/128"},
				MaxCalls: 10000, CallsPerSecond: 10000, CallBurst: 10000}},
		},
	}
	socks := sipfront.Sockets{UDP: udp, TCP: tcp}
	if w.cfg.SIP != nil {
		w.cfg.SIP(&cfg)
	}
	if cfg.APIAddr != "" {
		if socks.API, err = net.Listen("tcp", cfg.APIAddr); err != nil {
			_, _ = udp.Close(), tcp.Close()
			return fmt.Errorf("devworld: SIP call-control API: %w", err)
		}
		w.SIPAPIURL = "http://" + socks.API.Addr().String()
	}
	n, err := sipfront.NewNode(cfg, socks, w.env("sipfront"))
	if err != nil {
		return err
	}
	w.SIP, w.SIPURI = n, n.URI()
	w.run(new(running), "sipfront", n)
	return nil
}

// listenSIP opens UDP and TCP on addr's one port. With port 0 the UDP
// socket's port may be taken over TCP (a connection's local port, from
// the same ephemeral range), so another UDP port is tried, a bounded
// number of times.
func listenSIP(addr string) (net.PacketConn, net.Listener, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("devworld: SIP address %q: %w", addr, err)
	}
	tries := 1
	if port == "0" {
		tries = 20
	}
	for i := 0; ; i++ {
		udp, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("devworld: SIP over UDP: %w", err)
		}
		tcp, err := net.Listen("tcp", udp.LocalAddr().String())
		if err == nil {
			return udp, tcp, nil
		}
		_ = udp.Close()
		if i+1 >= tries {
			return nil, nil, fmt.Errorf("devworld: SIP over TCP: %w", err)
		}
	}
}
