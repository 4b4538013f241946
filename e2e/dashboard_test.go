package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/probe"
)

// dashboardPath is the Grafana dashboard docs/dashboard.md describes.
const dashboardPath = "../deploy/grafana/rtcedge.json"

// TestDashboardNamesRealMetrics keeps the Grafana dashboard honest: every
// rtcedge_* metric a panel's query or a template variable names must be
// exported by the binaries, and every label a query selects on or
// aggregates by must be on that metric (its own labels, or the target
// labels the scrape config attaches to that role: dashboardTargetLabels).
// The exports come from a running dev world whose pods talk to the
// Realtime reference server, after one talker call of the prober and one
// phone call through its SIP front.
func TestDashboardNamesRealMetrics(t *testing.T) {
	srv := startRefServer(t, refserver.Config{})
	w := startWorld(t, devworld.Config{BackendURL: srv.URL() + "?model=ref", BackendProtocol: "ga", SIPAddr: "127.0.0.1:0"})
	// The prober's series, and signaling's per-endpoint ones, appear with
	// a call: one talker call makes them.
	preg := prometheus.NewRegistry()
	pm, err := probe.NewMetrics(preg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var callErr error
	if err := probe.Continuous(ctx, probe.ContinuousConfig{
		Call:       probe.Config{SignalingURL: w.SignalingURL, Logger: testLogger(), Talk: &probe.TalkConfig{Turns: 1, Speech: 400 * time.Millisecond}},
		Iterations: 1, Metrics: pm, OnResult: func(_ probe.Report, err error) { callErr = err },
	}); err != nil {
		t.Fatalf("probe run: %v", err)
	}
	if callErr != nil {
		t.Fatalf("talker call: %v", callErr)
	}
	dashboardPhoneCall(ctx, t, w)
	exported := exportedMetrics{}
	exported.gather(t, w.Registry)
	exported.gather(t, preg)

	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	problems, n, err := checkDashboard(data, exported)
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Errorf("only %d queries in the dashboard", n)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestDashboardCheckCatchesBadQueries: the check refuses a metric nobody
// exports, a label a metric does not have (in a selector, a by clause or
// a template variable) and a target label of another role, and passes
// what is right.
func TestDashboardCheckCatchesBadQueries(t *testing.T) {
	exported := exportedMetrics{
		"rtcedge_transceiver_sessions_ended_total": {"reason": true, "node": true},
		"rtcedge_transceiver_setup_seconds":        {"node": true},
		"rtcedge_globalrelay_flows":                {"pop": true, "region": false},
	}
	dash := func(exprs ...string) []byte {
		var targets []map[string]string
		for _, e := range exprs {
			targets = append(targets, map[string]string{"expr": e})
		}
		b, err := json.Marshal(map[string]any{
			"panels": []any{map[string]any{"type": "row", "panels": []any{map[string]any{"title": "p", "targets": targets}}}},
			"templating": map[string]any{"list": []any{
				map[string]any{"name": "pop", "type": "query", "query": map[string]any{"query": "label_values(rtcedge_globalrelay_flows, pop)"}},
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := []string{
		`sum by (reason) (rate(rtcedge_transceiver_sessions_ended_total{region=~"$region", cluster=~"$cluster"}[$__rate_interval]))`,
		`histogram_quantile(0.9, sum by (le) (rate(rtcedge_transceiver_setup_seconds_bucket[5m])))`,
		`sum(rate(rtcedge_transceiver_setup_seconds_sum[5m])) / sum(rate(rtcedge_transceiver_setup_seconds_count[5m]))`,
		`sum(rtcedge_globalrelay_flows{pop=~"$pop"}) by (pop, region)`,
	}
	problems, n, err := checkDashboard(dash(good...), exported)
	if err != nil || len(problems) != 0 || n != len(good)+1 {
		t.Fatalf("good queries: %d checked, problems %q, err %v", n, problems, err)
	}
	for _, bad := range []string{
		`sum(rate(rtcedge_turn_made_up_total[5m]))`,                                              // nobody exports it
		`sum(rate(rtcedge_transceiver_sessions_ended_total{cause="x"}[5m]))`,                     // no such label
		`sum by (state) (rate(rtcedge_transceiver_sessions_ended_total[5m]))`,                    // nor in by
		`sum(rate(rtcedge_transceiver_sessions_ended_total[5m])) by (direction)`,                 // nor after
		`sum by (pop) (rate(rtcedge_transceiver_sessions_ended_total[5m]))`,                      // pods are not per POP
		`histogram_quantile(0.9, sum by (le) (rate(rtcedge_transceiver_setup_seconds_sum[5m])))`, // le is on _bucket
	} {
		if problems, _, _ := checkDashboard(dash(bad), exported); len(problems) != 1 {
			t.Errorf("%s: problems %q, want one", bad, problems)
		}
	}
	b := strings.Replace(string(dash(good[0])), "label_values(rtcedge_globalrelay_flows, pop)", "label_values(rtcedge_globalrelay_flows, cluster)", 1)
	if problems, _, _ := checkDashboard([]byte(b), exported); len(problems) != 1 {
		t.Errorf("template variable on a label the metric lacks: problems %q, want one", problems)
	}
}

// dashboardTargetLabels are the labels the scrape config attaches to every
// series of a role (docs/dashboard.md), by metric name prefix; job and
// instance are on every series. The dev world has no scrape config: its
// own node labels are not counted as labels of a metric (worldLabels).
var dashboardTargetLabels = []struct {
	prefix string
	labels []string
}{
	{"rtcedge_transceiver_", []string{"region", "cluster"}},
	{"rtcedge_realtime_", []string{"region", "cluster"}},
	{"rtcedge_turn_", []string{"region", "cluster"}},
	{"rtcedge_reply_audio_", []string{"region", "cluster"}},
	{"rtcedge_bargeins_", []string{"region", "cluster"}},
	{"rtcedge_clusterrelay_", []string{"region", "cluster"}},
	{"rtcedge_globalrelay_", []string{"region", "pop"}},
	{"rtcedge_routecache_", []string{"region", "pop"}},
	{"rtcedge_signaling_", []string{"region"}},
	{"rtcedge_sipfront_", []string{"region", "pop"}},
	{"rtcedge_membership_", []string{"region", "cluster", "pop"}},
}

// worldLabels name the dev world's nodes (devworld's labelNames); they
// stand in for instance. Its region and pop count only where a series
// gives them a value, as the scrape config's target labels would.
var worldLabels = []string{"node", "pod", "replica", "gen"}

// allowedLabels are the labels a query may use on fam.
func allowedLabels(exported exportedMetrics, fam string, bucket bool) map[string]bool {
	ok := map[string]bool{"job": true, "instance": true}
	for l, valued := range exported[fam] {
		if valued && !slices.Contains(worldLabels, l) {
			ok[l] = true
		}
	}
	for _, tl := range dashboardTargetLabels {
		if strings.HasPrefix(fam, tl.prefix) {
			for _, l := range tl.labels {
				ok[l] = true
			}
		}
	}
	if bucket {
		ok["le"] = true
	}
	return ok
}

// checkDashboard checks every query of a dashboard (panel targets, rows'
// panels included, and template variables) against exported. It returns
// the problems found and how many queries it checked.
func checkDashboard(data []byte, exported exportedMetrics) (problems []string, n int, err error) {
	var dash struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		return nil, 0, fmt.Errorf("dashboard JSON: %w", err)
	}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				n++
				for _, msg := range checkQuery(tg.Expr, exported) {
					problems = append(problems, fmt.Sprintf("panel %q: %s", p.Title, msg))
				}
			}
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			// Older dashboards keep the query as a plain string.
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				return nil, 0, fmt.Errorf("variable %s: %w", v.Name, err)
			}
		}
		n++
		for _, msg := range checkQuery(q.Query, exported) {
			problems = append(problems, fmt.Sprintf("variable %s: %s", v.Name, msg))
		}
	}
	return problems, n, nil
}

type dashPanel struct {
	Title   string      `json:"title"`
	Panels  []dashPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// promToken is one token of a PromQL expression: an identifier (metric,
// label, function, keyword, Grafana variable), a string, or punctuation.
type promToken struct {
	kind byte // 'i' identifier, 's' string, 'p' punctuation or operator, 'n' number
	text string
}

// lexPromQL splits a PromQL expression (with Grafana variables) into
// tokens; it does not validate the grammar.
func lexPromQL(s string) []promToken {
	var toks []promToken
	isIdent := func(c byte, first bool) bool {
		return c == '_' || c == ':' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			toks = append(toks, promToken{'s', s[i+1 : min(j, len(s))]})
			i = j + 1
		case c == '$' && i+1 < len(s) && s[i+1] == '{': // ${var}
			j := strings.IndexByte(s[i:], '}')
			if j < 0 {
				j = len(s) - i - 1
			}
			toks = append(toks, promToken{'i', s[i : i+j+1]})
			i += j + 1
		case isIdent(c, true):
			j := i + 1
			for j < len(s) && isIdent(s[j], false) {
				j++
			}
			toks = append(toks, promToken{'i', s[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			j := i + 1
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' || s[j] == 'e') {
				j++
			}
			toks = append(toks, promToken{'n', s[i:j]})
			i = j
		case strings.IndexByte("=!~<>+-*/^%", c) >= 0:
			j := i + 1
			for j < len(s) && strings.IndexByte("=!~<>", s[j]) >= 0 {
				j++
			}
			toks = append(toks, promToken{'p', s[i:j]})
			i = j
		default:
			toks = append(toks, promToken{'p', string(c)})
			i++
		}
	}
	return toks
}

// closing returns the index of the bracket that closes toks[open].
func closing(toks []promToken, open int) int {
	pair := map[string]string{"(": ")", "{": "}", "[": "]"}[toks[open].text]
	depth := 0
	for i := open; i < len(toks); i++ {
		if toks[i].kind != 'p' {
			continue
		}
		switch toks[i].text {
		case toks[open].text:
			depth++
		case pair:
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return len(toks) - 1
}

// labelList reads a parenthesised list of labels at toks[open].
func labelList(toks []promToken, open int) (labels []string, end int) {
	end = closing(toks, open)
	for _, tk := range toks[open+1 : end] {
		if tk.kind == 'i' {
			labels = append(labels, tk.text)
		}
	}
	return labels, end
}

// aggregations are PromQL's aggregation operators (they take by/without).
var aggregations = []string{"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "limitk", "limit_ratio"}

// metricUse is one rtcedge_* selector in a query.
type metricUse struct {
	name   string
	pos    int
	family string
	bucket bool
}

// checkQuery checks one query: its rtcedge_* names, the labels of their
// selectors, and the labels of its by clauses and label_values calls
// against the metrics they apply to.
func checkQuery(expr string, exported exportedMetrics) []string {
	toks := lexPromQL(expr)
	var problems []string
	var uses []metricUse
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		if tk.kind != 'i' || !strings.HasPrefix(tk.text, "rtcedge_") {
			continue
		}
		fam, bucket, ok := exported.family(tk.text)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: no component exports it", tk.text))
			continue
		}
		uses = append(uses, metricUse{name: tk.text, pos: i, family: fam, bucket: bucket})
		if i+1 < len(toks) && toks[i+1].text == "{" {
			end := closing(toks, i+1)
			allowed := allowedLabels(exported, fam, bucket)
			for j := i + 2; j+2 <= end; j++ {
				if toks[j].kind == 'i' && toks[j+1].kind == 'p' && toks[j+2].kind == 's' {
					if !allowed[toks[j].text] {
						problems = append(problems, fmt.Sprintf("%s has no label %s", tk.text, toks[j].text))
					}
					j += 2
				}
			}
			i = end
		}
	}
	// checkLabels checks labels against every metric used in toks[from:to].
	checkLabels := func(what string, labels []string, from, to int) {
		for _, u := range uses {
			if u.pos < from || u.pos > to {
				continue
			}
			allowed := allowedLabels(exported, u.family, u.bucket)
			for _, l := range labels {
				if !allowed[l] {
					problems = append(problems, fmt.Sprintf("%s: %s has no label %s", what, u.name, l))
				}
			}
		}
	}
	for i := 0; i+1 < len(toks); i++ {
		tk := toks[i]
		if tk.kind != 'i' {
			continue
		}
		switch {
		case tk.text == "label_values" && toks[i+1].text == "(":
			end := closing(toks, i+1)
			if end-1 > i+1 && toks[end-1].kind == 'i' {
				checkLabels("label_values", []string{toks[end-1].text}, i+1, end)
			}
		case slices.Contains(aggregations, tk.text):
			j := i + 1
			var labels []string
			by := false
			if toks[j].text == "by" || toks[j].text == "without" {
				by = toks[j].text == "by"
				if j+1 >= len(toks) || toks[j+1].text != "(" {
					continue
				}
				labels, j = labelList(toks, j+1)
				j++
			}
			if j >= len(toks) || toks[j].text != "(" {
				continue
			}
			end := closing(toks, j)
			if labels == nil && end+2 < len(toks) && (toks[end+1].text == "by" || toks[end+1].text == "without") && toks[end+2].text == "(" {
				by = toks[end+1].text == "by"
				labels, _ = labelList(toks, end+2)
			}
			if by {
				checkLabels(tk.text+" by", labels, j, end)
			}
		}
	}
	return problems
}

// dashboardPhoneCall places one phone call (INVITE, 200, ACK, BYE): the SIP
// front's setup histogram has series only once a call was answered.
func dashboardPhoneCall(ctx context.Context, t *testing.T, w *devworld.World) {
	t.Helper()
	to, cli := sipCarrier(t, w)
	dua := &sipgo.DialogUA{Client: cli, ContactHDR: sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "carrier", Host: "127.0.0.1", Port: 5999}}}
	offer := "v=0\r\no=carrier 1 1 IN IP4 127.0.0.1\r\ns=call\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
	call, err := dua.Invite(ctx, to, []byte(offer), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	defer call.Close()
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatalf("phone call: %v", err)
	}
	if err := call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := call.Bye(ctx); err != nil {
		t.Fatalf("BYE: %v", err)
	}
}
