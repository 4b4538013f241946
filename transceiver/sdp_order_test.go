package transceiver

import (
	"fmt"
	"slices"
	"testing"

	"github.com/pion/ice/v4"
)

// pairPriority is RFC 8445 section 6.1.2.3's candidate pair priority for a
// controlling client (the pod is ICE-lite, so always controlled).
func pairPriority(client, server uint32) uint64 {
	g, d := uint64(client), uint64(server)
	p := 1<<32*min(g, d) + 2*max(g, d)
	if g > d {
		p++
	}
	return p
}

// TestAnswerPairOrder: for the clients that matter, the candidate pairs
// that the answer's priorities make rank, best first: UDP to the nearest
// POP, TCP to the nearest POP, UDP to each backup in POP order, TCP to each
// backup. A client checks pairs in that order, and selects the best that
// works: UDP to the nearest POP wins wherever it works; with UDP dropped,
// the nearest POP's TCP pair is checked right after the first UDP check
// (docs/tcp.md, "Setup time"); a backup is used only when the nearest POP
// fails, by UDP where UDP works. And once Chromium has selected the
// nearest POP's TCP pair (its local candidate now peer-reflexive), every
// backup pair it has not checked yet ranks above it, so it is checked, not
// pruned: the pairs a failover needs.
func TestAnswerPairOrder(t *testing.T) {
	pionTCP, err := ice.NewCandidateHost(&ice.CandidateHostConfig{Network: "tcp", Address: "192.0.2.1", Port: 9, Component: 1, TCPType: ice.TCPTypeActive})
	if err != nil {
		t.Fatal(err)
	}
	pionUDP, err := ice.NewCandidateHost(&ice.CandidateHostConfig{Network: "udp", Address: "192.0.2.1", Port: 5000, Component: 1})
	if err != nil {
		t.Fatal(err)
	}
	clients := []struct {
		name     string
		udp, tcp uint32 // the client's host candidates' priorities
	}{
		// From Chromium 156: its offer's host candidates (type
		// preference 126 for UDP, 90 for TCP) on two interfaces; then
		// the lowest local preferences libwebrtc gives.
		{"chromium, first interface", 2122260223, 1518280447},
		{"chromium, other interface", 2122194687, 1518214911},
		{"chromium, lowest network preference", 126<<24 | 255, 90<<24 | 255},
		{"pion", pionUDP.Priority(), pionTCP.Priority()},
	}
	for _, pops := range []int{2, maxPOPs} {
		var want []string
		want = append(want, "udp 0", "tcp 0")
		for r := 1; r < pops; r++ {
			want = append(want, fmt.Sprintf("udp %d", r))
		}
		for r := 1; r < pops; r++ {
			want = append(want, fmt.Sprintf("tcp %d", r))
		}
		for _, c := range clients {
			type pair struct {
				name string
				prio uint64
			}
			var pairs []pair
			for r := range pops {
				pairs = append(pairs,
					pair{fmt.Sprintf("udp %d", r), pairPriority(c.udp, uint32(candidatePriority(r, false)))},
					pair{fmt.Sprintf("tcp %d", r), pairPriority(c.tcp, uint32(candidatePriority(r, true)))})
			}
			slices.SortStableFunc(pairs, func(a, b pair) int {
				switch {
				case a.prio > b.prio:
					return -1
				case a.prio < b.prio:
					return 1
				}
				return 0
			})
			var got []string
			for i, p := range pairs {
				got = append(got, p.name)
				if i > 0 && p.prio == pairs[i-1].prio {
					t.Errorf("%s, %d POPs: pairs %s and %s tie at %d", c.name, pops, pairs[i-1].name, p.name, p.prio)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s, %d POPs: pair order %v, want %v", c.name, pops, got, want)
			}
		}
	}
	// Chromium's peer-reflexive local candidate of a checked TCP pair
	// (getStats, type preference 80), with the highest local preference.
	const chromiumTCPPrflx = 80<<24 | 65535<<8 | 255
	for _, c := range clients[:3] {
		for pops := 2; pops <= maxPOPs; pops++ {
			selected := pairPriority(chromiumTCPPrflx, uint32(candidatePriority(0, true)))
			for r := 1; r < pops; r++ {
				for _, p := range []struct {
					name  string
					local uint32
					tcp   bool
				}{{"udp", c.udp, false}, {"tcp", c.tcp, true}} {
					if got := pairPriority(p.local, uint32(candidatePriority(r, p.tcp))); got <= selected {
						t.Errorf("%s, %d POPs: backup %d's %s pair (%d) ranks below the selected TCP pair to the nearest POP (%d): Chromium would prune it unchecked",
							c.name, pops, r, p.name, got, selected)
					}
				}
			}
		}
	}
}
