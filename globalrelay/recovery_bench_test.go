package globalrelay

// Benchmark of a restarted replica's recovery of its POP's flows from the
// route cache.

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/testredis"
)

// recoveryFlows is how many flows the restarted replica held.
const recoveryFlows = 100_000

// BenchmarkRestartRecovery restarts a global relay replica whose POP had
// 100,000 live flows in real Redis (written as a replica writes them:
// sealed entries, 250 clients per /24, eight per token) and reports the
// time from the new replica's start until 99 % of the flows forward again.
// Every client sends a media datagram every 20 ms; a datagram of an
// unknown flow is dropped and starts a lookup, as on the wire (the relay's
// packet decision is called directly: no sockets, so the figure is the
// recovery's, not the kernel's).
//
//   - bulk-load: the replica loads the POP's routes before it forwards
//     (what a node does before it reports ready), then lookups for the rest;
//   - lookups: no bulk load, lookups under the default budgets (20,000/s in
//     all, 1,000/s per source prefix);
//   - lookups-one-2000/s-bucket: the budget before this change, for
//     comparison; stopped after 5 s, reporting the share restored by then.
func BenchmarkRestartRecovery(b *testing.B) {
	srv := testredis.Start(b)
	clients := make([]netip.AddrPort, recoveryFlows)
	writer, err := routecache.Open(srv.URL(), routecache.Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go writer.Run(ctx)
	for i := range clients {
		// 198.18.0.0/15 (benchmarking range): 250 clients per /24.
		p, h := i/250, i%250
		clients[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18 + byte(p>>8), byte(p), byte(1 + h)}), 40000)
		var nonce [6]byte
		binary.BigEndian.PutUint32(nonce[2:], uint32(i/8))
		pod := uint16(1 + i%50)
		r := routecache.Route{Cluster: 0x12, Pod: pod, Token: nonce, Stored: uint32(time.Now().Unix())}
		r.KeyID, r.Tag = testHop.For(0x12).SealRoute(clients[i], 0x12, pod, nonce, r.Stored)
		writer.Store(clients[i], r)
		if i%4096 == 4095 {
			if err := writer.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := writer.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	writer.Close()

	cases := []struct {
		name  string
		bulk  bool
		cfg   routecache.Config
		limit time.Duration
	}{
		{"bulk-load", true, routecache.Config{}, 30 * time.Second},
		{"lookups", false, routecache.Config{}, 30 * time.Second},
		{"lookups-one-2000/s-bucket", false, routecache.Config{LookupsPerSec: 2000, PrefixLookupsPerSec: 1e9}, 5 * time.Second},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				took, share := restartOnce(b, srv.URL(), clients, tc.bulk, tc.cfg, tc.limit)
				b.ReportMetric(took.Seconds(), "s-to-99%")
				b.ReportMetric(100*share, "%-forwarding")
			}
		})
	}
}

// restartOnce starts a fresh replica over the Redis at url and sends media
// from every client every 20 ms until 99 % are forwarded or limit passes.
// It returns the time taken and the share forwarding at the end.
func restartOnce(b *testing.B, url string, clients []netip.AddrPort, bulk bool, cfg routecache.Config, limit time.Duration) (time.Duration, float64) {
	b.Helper()
	start := time.Now()
	var relay *Relay
	cfg.Logger = quiet
	cfg.OnFound = func(c netip.AddrPort, r routecache.Route) { relay.RestoreFlow(c, r) }
	cache, err := routecache.Open(url, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer cache.Close()
	cl := NewClusters([]Replica{{Cluster: 0x12, Addr: netip.MustParseAddrPort("127.0.0.1:9")}})
	relay, _, _ = newTestRelay(b, Config{Directory: cl, Cache: cache}, netip.AddrPort{})
	defer relay.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cache.Run(ctx)
	if bulk {
		if _, err := cache.(routecache.Loader).Load(ctx); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s-to-loaded")
	}
	ingress := netip.MustParseAddrPort("127.0.0.1:7")
	buf := make([]byte, encap.MaxLen+256)
	media := make([]byte, 120)
	media[0] = 0x80
	forwarding := make([]bool, len(clients))
	n := 0
	for round := time.Now(); ; round = round.Add(20 * time.Millisecond) {
		for i, c := range clients {
			if forwarding[i] {
				continue
			}
			copy(buf[encap.MaxLen:], media)
			if _, _, ok := relay.fromClient(buf, len(media), c, ingress); ok {
				forwarding[i] = true
				n++
			}
		}
		took := time.Since(start)
		if n*100 >= 99*len(clients) || took >= limit {
			return took, float64(n) / float64(len(clients))
		}
		time.Sleep(time.Until(round.Add(20 * time.Millisecond)))
	}
}
