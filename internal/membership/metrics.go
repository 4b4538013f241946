package membership

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a prometheus.Collector for this pool, labelled
// pool=<pool> (e.g. "cluster", "global"). It computes its values from
// Members at scrape time, so it holds no state of its own:
//
//	rtcedge_membership_members{pool,role,state}       gauge, members by role and state
//	rtcedge_membership_meta_decode_errors_total{pool} counter, member metadata undecodable or refused by CheckMeta or CheckMember
//	rtcedge_membership_deaths_total{pool}             counter, members declared dead (not left)
//
// Every known role × state series is exported, at zero when empty, so
// dashboards and alerts see the series before the first member arrives.
// Members with a role outside Roles are counted under role="other".
func (p *Pool) Collector(pool string) prometheus.Collector {
	labels := prometheus.Labels{"pool": pool}
	return &collector{
		p: p,
		members: prometheus.NewDesc("rtcedge_membership_members",
			"Members of the gossip pool as seen by this node, by role and state.",
			[]string{"role", "state"}, labels),
		badMeta: prometheus.NewDesc("rtcedge_membership_meta_decode_errors_total",
			"Member metadata updates that could not be decoded, that Config.CheckMeta refused (unknown cluster, capacity out of bounds) or that Config.CheckMember refused (no proof of the member's role, cluster, POP or pod, addresses not its own); such members are ignored.",
			nil, labels),
		deaths: prometheus.NewDesc("rtcedge_membership_deaths_total",
			"Members declared dead by failure detection (a graceful leave is not a death). Dead members drop out of members after a minute; this counter keeps the history for alerts.",
			nil, labels),
	}
}

type collector struct {
	p       *Pool
	members *prometheus.Desc
	badMeta *prometheus.Desc
	deaths  *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.members
	ch <- c.badMeta
	ch <- c.deaths
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	type key struct {
		role  Role
		state State
	}
	counts := make(map[key]int, (len(Roles)+1)*len(States))
	for _, r := range append(Roles[:len(Roles):len(Roles)], roleOther) {
		for _, s := range States {
			counts[key{r, s}] = 0
		}
	}
	for _, m := range c.p.Members() {
		r := m.Meta.Role
		if !knownRole(r) {
			r = roleOther // bounded label cardinality whatever peers send
		}
		counts[key{r, m.State}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(n), string(k.role), k.state.String())
	}
	ch <- prometheus.MustNewConstMetric(c.badMeta, prometheus.CounterValue, float64(c.p.badMeta.Load()))
	ch <- prometheus.MustNewConstMetric(c.deaths, prometheus.CounterValue, float64(c.p.deaths.Load()))
}

// roleOther labels members whose role this build does not know.
const roleOther Role = "other"

func knownRole(r Role) bool {
	for _, k := range Roles {
		if r == k {
			return true
		}
	}
	return false
}
