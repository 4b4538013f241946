package probe

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"time"
)

// WriteHTML writes the report as one self-contained HTML page: the summary
// table and inline-SVG histograms of setup time and echo RTT. It loads
// nothing from anywhere, so it can be mailed or archived as it is.
func (r LoadReport) WriteHTML(w io.Writer) error {
	type row struct {
		Name string
		D    Dist
	}
	data := struct {
		R          LoadReport
		Rows       []row
		Hists      []histogram
		Failures   []kv
		Placements []kv
		Generated  string
	}{
		R: r,
		Hists: []histogram{
			newHistogram("Setup time to first echo", "Time from posting the offer to the first echoed audio packet, per session.", r.setupSamples),
			newHistogram("Echo RTT", "Round-trip time of every echoed audio packet.", r.rttSamples),
		},
		Failures:   kvs(r.Failures),
		Placements: kvs(r.Placements),
		Generated:  time.Now().UTC().Format(time.RFC3339),
	}
	for _, s := range SetupStages {
		data.Rows = append(data.Rows, row{"setup: " + s, r.Setup[s]})
	}
	data.Rows = append(data.Rows, row{"echo RTT", r.RTT}, row{"jitter (per session)", r.Jitter}, row{"event reply", r.EventReply})
	if err := reportTemplate.Execute(w, data); err != nil {
		return fmt.Errorf("probe: write HTML report: %w", err)
	}
	return nil
}

type kv struct {
	K string
	V int
}

func kvs(m map[string]int) []kv {
	var out []kv
	for _, k := range sortedKeys(m) {
		out = append(out, kv{k, m[k]})
	}
	return out
}

// histogram is one SVG bar chart, laid out in Go so the template only
// places shapes.
type histogram struct {
	Title, Caption string
	Count          int
	Overflow       int     // samples above the last bin's upper edge, drawn in it
	Log            bool    // log-spaced bins
	Width, Height  float64 // of the whole SVG
	PlotX, PlotY   float64 // top-left of the plot area
	PlotW, PlotH   float64
	Bars           []bar
	XTicks         []tick
	YMax           int
}

type bar struct {
	X, Y, W, H float64
	Lo, Hi     float64 // ms
	N          int
}

type tick struct {
	X     float64
	Label string
}

// histogramBins is the number of bars; enough to show a bimodal setup time
// (direct vs backup POP), few enough to read.
const histogramBins = 40

// newHistogram bins samples for drawing. Samples that span more than a
// factor of 20 (an RTT with a tail) get log-spaced bins over the whole
// range, so the mode and the tail both show; others get linear bins from a
// round value below the minimum to one above the 99.5th percentile, with
// anything beyond drawn in the last bar.
func newHistogram(title, caption string, samples []time.Duration) histogram {
	h := histogram{Title: title, Caption: caption, Count: len(samples), Width: 720, Height: 260, PlotX: 56, PlotY: 16, PlotW: 640, PlotH: 200}
	if len(samples) == 0 {
		return h
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	lo, hi := max(ms(s[0]), 0.001), max(ms(s[len(s)-1]), 0.001)
	var edge func(i int) float64 // lower edge of bin i, in ms
	var bin func(v float64) int
	var pos func(v float64) float64 // x of value v
	if hi/lo > 20 {
		h.Log = true
		lo = math.Pow(10, math.Floor(math.Log10(lo)))
		hi = niceCeil(hi)
		span := math.Log(hi / lo)
		edge = func(i int) float64 { return lo * math.Exp(span*float64(i)/histogramBins) }
		bin = func(v float64) int { return int(math.Log(max(v, lo)/lo) / span * histogramBins) }
		pos = func(v float64) float64 { return h.PlotX + h.PlotW*math.Log(v/lo)/span }
		for d := lo; d <= hi*1.0001; d *= 10 {
			for _, m := range []float64{1, 2, 5} {
				if v := d * m; v <= hi*1.0001 {
					h.XTicks = append(h.XTicks, tick{X: pos(v), Label: trimFloat(v)})
				}
			}
		}
	} else {
		top := ms(nearestRank(s, 99.5))
		step := niceCeil(max(top-lo, 0.001) / 5)
		lo = math.Floor(lo/step) * step
		hi = lo + math.Ceil(max(top-lo, 0.001)/step)*step
		width := (hi - lo) / histogramBins
		edge = func(i int) float64 { return lo + float64(i)*width }
		bin = func(v float64) int { return int((v - lo) / width) }
		pos = func(v float64) float64 { return h.PlotX + h.PlotW*(v-lo)/(hi-lo) }
		for v := lo; v <= hi+step/2; v += step {
			h.XTicks = append(h.XTicks, tick{X: pos(v), Label: trimFloat(v)})
		}
	}
	counts := make([]int, histogramBins)
	for _, d := range s {
		v := ms(d)
		i := bin(v)
		if i >= histogramBins {
			if v > hi {
				h.Overflow++
			}
			i = histogramBins - 1
		}
		counts[max(i, 0)]++
	}
	h.YMax = slices.Max(counts)
	bw := h.PlotW / histogramBins
	for i, n := range counts {
		bh := h.PlotH * float64(n) / float64(h.YMax)
		h.Bars = append(h.Bars, bar{
			X: h.PlotX + float64(i)*bw + 0.5, Y: h.PlotY + h.PlotH - bh, W: bw - 1, H: bh,
			Lo: edge(i), Hi: edge(i + 1), N: n,
		})
	}
	return h
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, for round axis
// labels.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v*0.999999 {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	switch {
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"f":   func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"ms":  func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"pct": func(v float64) string { return fmt.Sprintf("%.3f%%", 100*v) },
	"add": func(a, b float64) float64 { return a + b },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>rtcedge load report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 760px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .2em .8em; text-align: right; border-bottom: 1px solid #ddd; }
th:first-child, td:first-child { text-align: left; }
.caption { color: #666; margin: 0; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.bar { fill: #3a78c2; } .bar:hover { fill: #1d4f8c; }
.axis { stroke: #888; stroke-width: 1; }
.bad { color: #b00020; }
</style>
</head>
<body>
<h1>rtcedge load report</h1>
<p>Target <code>{{.R.Target}}</code>: {{.R.Sessions}} sessions, ramp {{f .R.RampSecs}} s, {{f .R.DurationSecs}} s at full load, {{f .R.ElapsedSecs}} s in all{{if .R.Interrupted}} <strong class="bad">(interrupted)</strong>{{end}}. Generated {{.Generated}}.</p>

<h2>Sessions</h2>
<table>
<tr><th>started</th><th>connected</th><th>echoed</th><th>completed</th><th>failed</th></tr>
<tr><td>{{.R.Started}}</td><td>{{.R.Connected}}</td><td>{{.R.Echoed}}</td><td>{{.R.Completed}}</td><td{{if .R.Failed}} class="bad"{{end}}>{{.R.Failed}}</td></tr>
</table>
{{if .Placements}}<table>
<tr><th>placed in region/POP/cluster</th><th>sessions</th></tr>
{{range .Placements}}<tr><td>{{.K}}</td><td>{{.V}}</td></tr>
{{end}}</table>{{end}}

<h2>Summary (ms)</h2>
<table id="summary">
<tr><th></th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>max</th><th>mean</th></tr>
{{range .Rows}}<tr><td>{{.Name}}</td><td>{{.D.Count}}</td><td>{{ms .D.P50}}</td><td>{{ms .D.P90}}</td><td>{{ms .D.P99}}</td><td>{{ms .D.Max}}</td><td>{{ms .D.Mean}}</td></tr>
{{end}}</table>
<p>Loss {{pct .R.LossRatio}} ({{.R.PacketsLost}} of {{.R.PacketsSent}} audio packets not echoed), worst session {{pct .R.WorstLoss}}.</p>

<h2>Failures</h2>
{{if .Failures}}<table>
<tr><th>reason</th><th>sessions</th></tr>
{{range .Failures}}<tr><td>{{.K}}</td><td>{{.V}}</td></tr>
{{end}}</table>{{else}}<p>None.</p>{{end}}

{{range .Hists}}<h2>{{.Title}}</h2>
<p class="caption">{{.Caption}} {{.Count}} samples{{if .Overflow}}; {{.Overflow}} beyond the axis are in the last bar{{end}}.</p>
{{if .Count}}<svg class="histogram" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Title}} histogram">
{{range .Bars}}<rect class="bar" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{ms .Lo}}–{{ms .Hi}} ms: {{.N}}</title></rect>
{{end}}<line class="axis" x1="{{.PlotX}}" y1="{{add .PlotY .PlotH}}" x2="{{add .PlotX .PlotW}}" y2="{{add .PlotY .PlotH}}"/>
<line class="axis" x1="{{.PlotX}}" y1="{{.PlotY}}" x2="{{.PlotX}}" y2="{{add .PlotY .PlotH}}"/>
{{$h := .}}{{range .XTicks}}<text x="{{.X}}" y="{{add $h.PlotY (add $h.PlotH 16.0)}}" text-anchor="middle">{{.Label}}</text>
{{end}}<text x="{{add .PlotX .PlotW}}" y="{{add .PlotY (add .PlotH 32.0)}}" text-anchor="end">ms{{if .Log}} (log scale){{end}}</text>
<text x="{{add .PlotX -6.0}}" y="{{add .PlotY 4.0}}" text-anchor="end">{{.YMax}}</text>
<text x="{{add .PlotX -6.0}}" y="{{add .PlotY .PlotH}}" text-anchor="end">0</text>
</svg>{{end}}
{{end}}
</body>
</html>
`))
