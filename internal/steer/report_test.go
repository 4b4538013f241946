package steer

import (
	"errors"
	"testing"
	"time"
)

// testAuthority is a cluster relay's keys with fixed secrets: ticket key
// ID 1, and pod p's report key "pod" || p.
func testAuthority() *Authority {
	return &Authority{
		Cluster: 3, TicketID: 1,
		TicketKey: func(id uint8) []byte {
			if id != 1 {
				return nil
			}
			return []byte("ticket key of cluster 3")
		},
		ReportKey: func(id uint8, pod uint16) []byte {
			if id != 1 {
				return nil
			}
			return []byte{'p', 'o', 'd', byte(pod >> 8), byte(pod)}
		},
	}
}

// TestReportsAreBoundToTheirPodAndCalls: a report is believed only with
// its pod's tag and, per call, a ticket the front minted for that pod,
// that key and those POPs, not older than TicketMaxAge; one bad call
// refuses the whole report.
func TestReportsAreBoundToTheirPodAndCalls(t *testing.T) {
	a := testAuthority()
	now := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	k, other := key("198.51.100.1"), key("203.0.113.1")
	mint := func(pod uint16, k Key, pops ...uint16) Ticket {
		tk, err := a.Mint(pod, k, pops, now)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseTicket(tk.String())
		if err != nil || back != tk {
			t.Fatalf("ticket text: %v %v", back, err)
		}
		return back
	}
	good := Call{Key: k, Ticket: mint(7, k, 1, 2), POPs: []uint16{1, 2}, RTTs: []RTT{{1, 20 * time.Millisecond}, {2, 160 * time.Millisecond}}}
	report := func(pod, signer uint16, calls ...Call) []byte {
		b, n := AppendReport(nil, 3, pod, 1, a.ReportKey(1, signer), calls)
		if n != len(calls) {
			t.Fatalf("took %d of %d calls", n, len(calls))
		}
		return b
	}
	check := func(b []byte, at time.Time) error {
		r, err := ParseReport(b)
		if err != nil {
			return err
		}
		return a.Check(&r, at)
	}

	b := report(7, 7, good)
	r, err := ParseReport(b)
	if err != nil || a.Check(&r, now.Add(time.Minute)) != nil {
		t.Fatalf("a good report: %v %v", err, a.Check(&r, now))
	}
	if s := r.Samples(); len(s) != 2 || s[0] != (Sample{k, 1, 20 * time.Millisecond}) || s[1].POP != 2 {
		t.Fatalf("samples %+v", s)
	}
	for i := range b {
		if _, err := ParseReport(b[:i]); err == nil {
			t.Fatalf("truncated at %d accepted", i)
		}
	}

	bad := func(name string, b []byte, at time.Time) {
		t.Helper()
		if err := check(b, at); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !errors.Is(err, ErrReport) && !errors.Is(err, errReport) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Another pod's name, with its own key: the tag does not verify.
	bad("as another pod", report(8, 7, good), now)
	// Its own name and key, but another pod's ticket.
	stolen := good
	stolen.Ticket = mint(8, k, 1, 2)
	bad("another pod's ticket", report(7, 7, stolen), now)
	// A prefix it was not given a call from.
	wrongKey := good
	wrongKey.Key = other
	bad("another prefix", report(7, 7, wrongKey), now)
	// A POP its call was not offered, named in the call or only sampled.
	morePOPs := good
	morePOPs.POPs = []uint16{1, 2, 3}
	bad("a POP added to the call", report(7, 7, morePOPs), now)
	farPOP := good
	farPOP.RTTs = []RTT{{3, time.Millisecond}}
	bad("a sample through a POP not offered", report(7, 7, farPOP), now)
	// A ticket out of date, or from the future.
	bad("an old ticket", report(7, 7, good), now.Add(TicketMaxAge+time.Second))
	bad("a ticket from the future", report(7, 7, good), now.Add(-time.Minute))
	// Unsigned, or one bad call among good ones.
	unsigned, _ := AppendReport(nil, 3, 7, 0, nil, []Call{good})
	bad("unsigned", unsigned, now)
	bad("one bad call of two", report(7, 7, good, wrongKey), now)
	// Another cluster's report.
	b, _ = AppendReport(nil, 4, 7, 1, a.ReportKey(1, 7), []Call{good})
	bad("another cluster", b, now)

	// Full: as many calls as fit.
	many := make([]Call, 100)
	for i := range many {
		many[i] = good
	}
	b, n := AppendReport(nil, 3, 7, 1, a.ReportKey(1, 7), many)
	if len(b) > MaxMessage || n == 0 || n == len(many) {
		t.Fatalf("%d bytes, %d calls", len(b), n)
	}
	if err := check(b, now); err != nil {
		t.Fatalf("a full report: %v", err)
	}
}
