package sim

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rtcedge/rtcedge/probe"
)

// CallConfig is a probe config for a client at site: it posts through the
// site's signaling link from the site's address, with the location headers
// a Cloudflare edge would add, and gathers candidates on loopback only.
func (s *Site) CallConfig() probe.Config {
	return probe.Config{
		SignalingURL: s.SignalingURL,
		HTTPClient:   s.HTTPClient,
		Headers:      s.Headers(),
		Logger:       quietLogger(),
		IPFilter:     func(ip net.IP) bool { return ip.IsLoopback() },
	}
}

// Report is what a simulation run measured. Durations are in milliseconds;
// "RTTs" columns divide by the simulated round trip (SignalingRTTMs for the
// signaling row, MediaRTTMs for the others).
type Report struct {
	NearOneWayMs   float64 `json:"near_one_way_ms"`
	FarOneWayMs    float64 `json:"far_one_way_ms"`
	SignalingRTTMs float64 `json:"signaling_rtt_ms"`
	MediaRTTMs     float64 `json:"media_rtt_ms"`
	// GoalMs is the setup goal POST → DTLS connected: one signaling round
	// trip plus three media round trips plus 20 ms.
	GoalMs float64      `json:"goal_ms"`
	Sites  []SiteReport `json:"sites"`
	// Phone holds each site's phone calls (Config.SIP), beside its
	// WebRTC calls in Sites.
	Phone []PhoneReport `json:"phone,omitempty"`
	// Browser holds headless Chromium's calls, when they ran.
	Browser []Scenario `json:"browser,omitempty"`
	Faults  []Scenario `json:"faults,omitempty"`
}

// SiteReport is one client site's calls.
type SiteReport struct {
	Site    string `json:"site"`
	City    string `json:"city"`
	Region  string `json:"region"` // where every call was placed
	Cluster string `json:"cluster"`
	POP     string `json:"pop"`
	Calls   int    `json:"calls"`
	Rows    []Row  `json:"rows"`
}

// PhoneReport is one site's phone calls: its carrier's trunk, pinned to
// the carrier POP of the site's near region.
type PhoneReport struct {
	Site  string `json:"site"`
	City  string `json:"city"`
	Trunk string `json:"trunk"`
	POP   string `json:"pop"` // where every call's media went
	Calls int    `json:"calls"`
	// OtherCluster counts the calls placed outside the near region's
	// cluster (one that did not answer in time passes calls on).
	OtherCluster int   `json:"other_cluster"`
	Rows         []Row `json:"rows"`
}

// Row names of a PhoneReport.
const (
	RowInviteOK    = "INVITE → 200 OK"
	RowAckAudio    = "ACK → audio flowing"
	noteInviteOK   = "1 signaling RTT + placement at a pod"
	noteAckAudioMs = "goal ≤ 1 media RTT after the ACK; the echo's floor is 1 RTT"
)

// PhoneRows turns a site's phone calls into the report's rows.
func PhoneRows(calls []PhoneResult, sigRTT, mediaRTT time.Duration) []Row {
	var invite, audio []time.Duration
	for _, c := range calls {
		invite = append(invite, c.InviteToOK)
		audio = append(audio, c.AckToAudio)
	}
	row := func(name, note string, rtt time.Duration, v []time.Duration) Row {
		med, mx := medianMax(v)
		return Row{Name: name, MedianMs: ms(med), MaxMs: ms(mx), RTTs: float64(med) / float64(rtt), Note: note}
	}
	return []Row{row(RowInviteOK, noteInviteOK, sigRTT, invite), row(RowAckAudio, noteAckAudioMs, mediaRTT, audio)}
}

// Row is one measured quantity over a site's calls.
type Row struct {
	Name     string  `json:"name"`
	MedianMs float64 `json:"median_ms"`
	MaxMs    float64 `json:"max_ms"`
	// RTTs is the median in units of the simulated round trip.
	RTTs float64 `json:"rtts"`
	Note string  `json:"note,omitempty"`
}

// Scenario is one scenario beyond the plain calls: a fault on a site's
// links, or another client.
type Scenario struct {
	Name   string `json:"name"`
	Action string `json:"action"` // what was done
	Result string `json:"result"` // what was observed, with the numbers
}

// Row names of a SiteReport, in table order.
const (
	RowSignaling     = "signaling (POST → answer)"
	RowICE           = "ICE connected (from POST)"
	RowDTLS          = "DTLS connected (from POST)"
	RowFirstEcho     = "first echo (from POST)"
	RowICEAfter      = "answer → ICE connected"
	RowDTLSAfterICE  = "ICE → DTLS connected"
	RowEchoRTT       = "echo RTT (median per call)"
	RowBrowserDTLS   = "POST → DTLS, first-check client"
	noteICETick      = "Pion nominates on its next 200 ms check tick"
	noteDTLS         = "server is the DTLS client (setup:active)"
	noteBrowserDTLS  = "signaling + 1 media RTT + (ICE → DTLS)"
	noteFirstEchoRow = "probe starts audio once the data channel is open"
)

// SiteRows turns a site's call results into the report's rows.
func SiteRows(timings []probe.Timings, rtts []time.Duration, sigRTT, mediaRTT time.Duration) []Row {
	col := func(f func(probe.Timings) time.Duration) []time.Duration {
		out := make([]time.Duration, len(timings))
		for i, tm := range timings {
			out[i] = f(tm)
		}
		return out
	}
	row := func(name, note string, rtt time.Duration, v []time.Duration) Row {
		med, mx := medianMax(v)
		return Row{Name: name, MedianMs: ms(med), MaxMs: ms(mx), RTTs: float64(med) / float64(rtt), Note: note}
	}
	return []Row{
		row(RowSignaling, "", sigRTT, col(func(t probe.Timings) time.Duration { return t.Signaling })),
		row(RowICE, noteICETick, mediaRTT, col(func(t probe.Timings) time.Duration { return t.ICEConnected })),
		row(RowDTLS, "", mediaRTT, col(func(t probe.Timings) time.Duration { return t.DTLSConnected })),
		row(RowFirstEcho, noteFirstEchoRow, mediaRTT, col(func(t probe.Timings) time.Duration { return t.FirstEcho })),
		row(RowICEAfter, noteICETick, mediaRTT, col(func(t probe.Timings) time.Duration { return t.ICEConnected - t.Signaling })),
		row(RowDTLSAfterICE, noteDTLS, mediaRTT, col(func(t probe.Timings) time.Duration { return t.DTLSConnected - t.ICEConnected })),
		row(RowEchoRTT, "", mediaRTT, rtts),
		row(RowBrowserDTLS, noteBrowserDTLS, mediaRTT, col(func(t probe.Timings) time.Duration {
			return t.Signaling + mediaRTT + t.DTLSConnected - t.ICEConnected
		})),
	}
}

// Row returns the named row, or a zero Row.
func (s SiteReport) Row(name string) Row {
	for _, r := range s.Rows {
		if r.Name == name {
			return r
		}
	}
	return Row{}
}

// Median returns the median of v (the lower one of an even count), or 0.
func Median(v []time.Duration) time.Duration {
	med, _ := medianMax(v)
	return med
}

func medianMax(v []time.Duration) (med, mx time.Duration) {
	if len(v) == 0 {
		return 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2], s[len(s)-1]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Text renders the report as plain-text tables.
func (r Report) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "links: %.0f ms one way site↔near region, %.0f ms between regions; signaling RTT %.0f ms, media RTT %.0f ms\n",
		r.NearOneWayMs, r.FarOneWayMs, r.SignalingRTTMs, r.MediaRTTMs)
	fmt.Fprintf(&b, "goal POST → DTLS connected ≤ 1 signaling RTT + 3 media RTT + 20 ms = %.0f ms\n", r.GoalMs)
	for _, s := range r.Sites {
		fmt.Fprintf(&b, "\nsite %s (%s): %d calls, all placed in %s, cluster %s, POP %s\n", s.Site, s.City, s.Calls, s.Region, s.Cluster, s.POP)
		writeRows(&b, s.Rows)
	}
	for _, p := range r.Phone {
		fmt.Fprintf(&b, "\nsite %s (%s): %d phone calls on trunk %s, media through POP %s, %d placed outside the near cluster\n", p.Site, p.City, p.Calls, p.Trunk, p.POP, p.OtherCluster)
		writeRows(&b, p.Rows)
	}
	for _, list := range []struct {
		title string
		items []Scenario
	}{{"browser", r.Browser}, {"faults", r.Faults}} {
		if len(list.items) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s:\n", list.title)
		for _, f := range list.items {
			fmt.Fprintf(&b, "- %s: %s\n  %s\n", f.Name, f.Action, f.Result)
		}
	}
	return b.String()
}

// writeRows renders rows as a table.
func writeRows(b *strings.Builder, rows []Row) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tmedian ms\tmax ms\tRTTs\t")
	for _, row := range rows {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t  %s\n", row.Name, row.MedianMs, row.MaxMs, row.RTTs, row.Note)
	}
	_ = tw.Flush()
}

// WriteFiles writes sim-report.json and sim-report.txt into dir.
func (r Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report dir: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sim-report.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sim-report.txt"), []byte(r.Text()), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
