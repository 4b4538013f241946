package podnet

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// BenchmarkPodReader: how many datagrams a second the pod socket's batched
// reader hands to its POP conn, 1,000 clients' sealed media arriving from a
// cluster relay (sendmmsg, 32 a call) and a consumer draining the POP conn:
// "flood" as fast as one sender can push, "1000-sessions" paced at the
// 50,000/s that 1,000 voice sessions send. Reported as delivered
// datagrams/s and the share lost.
func BenchmarkPodReader(b *testing.B) {
	b.Run("flood", func(b *testing.B) { benchPodReader(b, 0) })
	b.Run("1000-sessions", func(b *testing.B) { benchPodReader(b, 50_000) })
}

func benchPodReader(b *testing.B, pps int) {
	const clients = 1000
	podConn, relay := udp4(b), udp4(b)
	defer relay.Close()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		b.Fatal(err)
	}
	sock := newPodSocket(podConn, 7, 3, testHop, nil, m, time.Now)
	pc, _, err := sock.popConn(1, netip.MustParseAddrPort("127.0.0.2:3478"))
	if err != nil {
		b.Fatal(err)
	}
	// One session conn takes every client: the mux routes known addresses
	// to their session (the STUN that would teach it them is not the point).
	sc, err := pc.mux.GetConn("bench-session-ufrag1", nil)
	if err != nil {
		b.Fatal(err)
	}
	session := sc.(*muxConn)
	readDone := make(chan struct{})
	go func() { _ = sock.readLoop(sock.conn); close(readDone) }()
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 2048)
		n := 0
		for { // no deadline: a deadline arms a timer per read
			if _, _, err := session.ReadFromAddrPort(buf); err != nil {
				got <- n
				return
			}
			n++
		}
	}()
	defer func() { podConn.Close(); sock.closeAll(); <-readDone }()
	ingress := relay.LocalAddr().(*net.UDPAddr).AddrPort()
	msgs := make([]udpio.Msg, clients)
	to := podConn.LocalAddr().(*net.UDPAddr).AddrPort()
	for i := range msgs {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 40000)
		msgs[i] = udpio.Msg{Buf: sealed(b, encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: c, Ingress: ingress}, string(make([]byte, 120))), Addr: to}
		pc.mux.mu.Lock()
		pc.mux.byAddr[c] = session
		pc.mux.mu.Unlock()
	}
	wr := udpio.NewBatchConn(relay, 32)
	// Open every client's route first (as Pion's authentication would).
	for i := range msgs {
		if _, err := wr.WriteBatch(msgs[i : i+1]); err != nil {
			b.Fatal(err)
		}
		sock.Confirm(1, netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 40000), "feed", [12]byte{1})
	}
	b.ResetTimer()
	start := time.Now()
	sent := 0
	for sent < b.N {
		if pps > 0 {
			if due := start.Add(time.Duration(sent) * time.Second / time.Duration(pps)); time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
		}
		k := min(32, b.N-sent)
		off := sent % clients
		k = min(k, clients-off)
		n, err := wr.WriteBatch(msgs[off : off+k])
		if err != nil {
			b.Fatal(err)
		}
		sent += n
	}
	elapsed := time.Since(start)
	time.Sleep(300 * time.Millisecond) // let the queues drain
	pc.Close()
	session.Close()
	delivered := <-got - clients // the route-opening datagrams
	b.StopTimer()
	var queueFull float64
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == "rtcedge_transceiver_dropped_packets_total" && l.GetValue() == "session_queue_full" {
					queueFull += m.GetCounter().GetValue()
				}
			}
		}
	}
	b.ReportMetric(queueFull/float64(b.N), "queue-full-ratio")
	b.ReportMetric(float64(delivered)/elapsed.Seconds(), "delivered-pps")
	b.ReportMetric(1-float64(delivered)/float64(b.N), "lost-ratio")
}
