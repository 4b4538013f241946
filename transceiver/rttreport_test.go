package transceiver

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// TestRTTReportCarriesEachCallsTicket: samples of two calls, measured
// interleaved, leave in one report as two calls, each with its own key,
// ticket and POPs, tagged with the pod's key: the cluster relay (its
// steer.Authority) believes it, and would not under another pod's name.
func TestRTTReportCarriesEachCallsTicket(t *testing.T) {
	root := make([]byte, authority.KeyLen)
	if _, err := rand.Read(root); err != nil {
		t.Fatal(err)
	}
	sec, err := authority.Parse([]string{authority.Spec(3, 1, authority.ClusterSecret(root, 3))})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := sec.SteerAuthority(3)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sec.Pod(3, 7)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRTTReporter(&keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	call := func(prefix string) *rttPaths {
		k, err := steer.ParseKey(prefix)
		if err != nil {
			t.Fatal(err)
		}
		tk, err := relay.Mint(7, k, []uint16{1, 2}, now)
		if err != nil {
			t.Fatal(err)
		}
		return &rttPaths{key: k, ticket: tk, pops: []uint16{1, 2}}
	}
	a, b := call("198.51.100.0/24@48,2"), call("203.0.113.0/24@40,-74")
	r.add(a, steer.RTT{POP: 1, RTT: 20 * time.Millisecond})
	r.add(b, steer.RTT{POP: 2, RTT: 30 * time.Millisecond})
	r.add(a, steer.RTT{POP: 2, RTT: 160 * time.Millisecond})
	calls := r.take()
	if len(calls) != 2 || calls[0].Key != a.key || len(calls[0].RTTs) != 2 || calls[1].Ticket != b.ticket || len(calls[1].RTTs) != 1 {
		t.Fatalf("calls %+v", calls)
	}
	msg, n := steer.AppendReport(nil, 3, 7, r.keyID, r.key, calls)
	rep, err := steer.ParseReport(msg)
	if n != 2 || err != nil {
		t.Fatalf("report of %d calls: %v", n, err)
	}
	if err := relay.Check(&rep, now); err != nil {
		t.Fatalf("the relay refuses the pod's report: %v", err)
	}
	msg, _ = steer.AppendReport(nil, 3, 8, r.keyID, r.key, calls)
	if rep, err = steer.ParseReport(msg); err != nil || relay.Check(&rep, now) == nil {
		t.Fatalf("the same report as pod 8: %v, believed", err)
	}
}
