package signaling

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// Steering by measured round trips (docs/steering.md). Each replica holds
// a steer.Table, fed by the samples the pods measure (passed on by the
// cluster relays over the global gossip pool) and by `rtcedge probe`'s
// synthetic clients (POST /v1/steering/samples with a probe key, passed
// on by the replica that took them to the others), each counted as its
// reporter's (the pod the relay checked and stamped, or the probe's key:
// one sample per reporter and POP), and consults it for every offer. With
// the deployment authority a samples message is believed only under the
// key of its reporter's role: a pod's under its own cluster's relay key,
// a probe's under the signaling key (internal/steer, wire.go).

// HeaderSteering says why the call's first POP was chosen: distance,
// measured, explore or override.
const HeaderSteering = "X-Rtcedge-Steering"

// Reasons in HeaderSteering and rtcedge_signaling_steering_total besides
// steer.Reason's.
const reasonOverride = "override"

// SteeringConfig is the steering section of the config.
type SteeringConfig struct {
	steer.Config `yaml:",inline"`
	// Disabled: distance and the catalogue's overrides only; samples are
	// still taken (so turning it back on starts warm).
	Disabled bool `yaml:"disabled"`
	// Pins are operator overrides: callers in Prefix get these POPs (by
	// name, first preferred; those not up are skipped), whatever was
	// measured. The most specific prefix wins.
	Pins []SteeringPin `yaml:"pins"`
}

// SteeringPin sends a prefix's callers to named POPs.
type SteeringPin struct {
	Prefix string   `yaml:"prefix"`
	POPs   []string `yaml:"pops"`
}

type pin struct {
	prefix netip.Prefix
	pops   []geo.POP
}

// steering is a Server's steering state. Every field but table is set by
// newSteering, or by NewServer (fanOut) and setSteerKeys (keys) before the
// server serves or gossip delivers a message, and read-only after; table
// is safe for concurrent use.
type steering struct {
	table *steer.Table // safe for concurrent use
	// Set before the server runs, read-only after.
	disabled bool
	pins     []pin              // most specific first
	region   map[uint16]string  // POP ID → its region
	byName   map[string]geo.POP // POP name → POP
	clusters map[uint16]bool    // the catalogue's clusters
	now      func() time.Time
	// fanOut passes a samples message on to the other replicas; nil
	// without gossip.
	fanOut func(msg []byte)
	// keys are the signer of the samples this replica passes on and the
	// verifier of those it receives, asked per message so that a key
	// reload takes effect at once; nil without the deployment authority
	// (messages go unsigned, and every well-formed one is believed).
	// Set before gossip delivers messages (setSteerKeys).
	keys    func() (*steer.Signer, *steer.Verifier)
	choices *prometheus.CounterVec
	samples *prometheus.CounterVec
	dropped *prometheus.CounterVec
}

var steeringReasons = []string{steer.ByDistance.String(), steer.ByMeasure.String(), steer.ByExplore.String(), reasonOverride}

func newSteering(cfg SteeringConfig, cat *geo.Catalogue, now func() time.Time, reg prometheus.Registerer) (*steering, error) {
	st := &steering{disabled: cfg.Disabled, region: map[uint16]string{}, byName: map[string]geo.POP{}, clusters: map[uint16]bool{}, now: now,
		choices: metric.CounterVec("rtcedge_signaling_steering_total", "Placed offers by why their first POP was chosen (distance, measured, explore, override).", "reason"),
		samples: metric.CounterVec("rtcedge_signaling_steering_samples_total", "Round-trip samples taken from believed messages and probes' posts, by source (pod, probe) and result (accepted, invalid).", "source", "result"),
		dropped: metric.CounterVec("rtcedge_signaling_steering_messages_dropped_total", "Samples messages from the global pool dropped whole, by reason: invalid (malformed, or a POP the catalogue lacks), "+
			"unsigned, unknown_signer (no key of the signing cluster or key ID, or a cluster the catalogue lacks), wrong_signer (pod samples not signed by their own cluster's relay, probe samples not by signaling), "+
			"bad_signature, stale (signed over a minute ago or ahead of the clock).", "reason"),
	}
	for _, r := range cat.Regions {
		for _, p := range r.POPs {
			st.region[p.ID], st.byName[p.Name] = r.Name, p
		}
		for _, c := range r.Clusters {
			st.clusters[c.ID] = true
		}
	}
	tc := cfg.Config
	tc.Now = now
	var err error
	if st.table, err = steer.New(tc); err != nil {
		return nil, err
	}
	for _, p := range cfg.Pins {
		pfx, err := netip.ParsePrefix(p.Prefix)
		if err != nil {
			return nil, fmt.Errorf("steering pins: %w", err)
		}
		pn := pin{prefix: pfx.Masked()}
		for _, name := range p.POPs {
			pop, ok := st.byName[name]
			if !ok {
				return nil, fmt.Errorf("steering pins: %s: no POP named %q in the catalogue", p.Prefix, name)
			}
			pn.pops = append(pn.pops, pop)
		}
		if len(pn.pops) == 0 {
			return nil, fmt.Errorf("steering pins: %s: no POPs", p.Prefix)
		}
		st.pins = append(st.pins, pn)
	}
	slices.SortStableFunc(st.pins, func(a, b pin) int { return b.prefix.Bits() - a.prefix.Bits() })
	for _, r := range steeringReasons {
		st.choices.WithLabelValues(r)
	}
	for _, src := range []steer.Source{steer.SourcePod, steer.SourceProbe} {
		st.samples.WithLabelValues(src.String(), "accepted")
		st.samples.WithLabelValues(src.String(), "invalid")
	}
	for _, d := range steer.Drops {
		st.dropped.WithLabelValues(d.String())
	}
	if err := metric.Register(reg, "signaling steering", st.choices, st.samples, st.dropped); err != nil {
		return nil, err
	}
	return st, nil
}

// keyOf is the steering key of a located caller.
func keyOf(loc geo.Location) steer.Key {
	return steer.KeyFor(loc.IP, loc.Source != geo.SourceDefault, loc.Point.Lat, loc.Point.Lon)
}

// choosePOPs picks the call's POPs (first and backup) and says why; when
// the first was not chosen by distance, the clusters of its region move
// to the front of choice (among the usable ones, so within their
// allowance). The first POP is one gossip reports up; so is the backup
// when there is one, else the backup is the nearest other POP (withBackup).
func (s *Server) choosePOPs(loc geo.Location, key steer.Key, choice *geo.Choice) ([]geo.POP, string) {
	st := s.steer
	if pops := st.pinned(loc.IP, s.cfg.POPUp); len(pops) > 0 {
		st.preferRegion(choice, pops[0].ID)
		return pops, reasonOverride
	}
	pops, reason := s.chooseUpPOPs(loc, key, choice)
	return withBackup(pops, s.cfg.CatalogueData.ChoosePOPsFor(loc, 0, nil)), reason
}

// withBackup gives a call placed on a single up POP a backup: the first of
// others (the POPs the call may use, in order of preference) that is not
// the first POP. A down verdict of gossip can be wrong for a while (a
// replica that has not learned a member yet, a slow member declared dead
// on a loaded machine), and an answer without a backup has no failover,
// while a backup that is really down costs the client nothing: it checks
// the backup's lower-priority candidates, gets no answer, and keeps the
// first POP.
func withBackup(pops, others []geo.POP) []geo.POP {
	if len(pops) != 1 {
		return pops
	}
	for _, p := range others {
		if p.ID != pops[0].ID {
			return append(pops, p)
		}
	}
	return pops
}

// chooseUpPOPs picks the call's POPs among those gossip reports up, by the
// catalogue's overrides, measured round trips or distance.
func (s *Server) chooseUpPOPs(loc geo.Location, key steer.Key, choice *geo.Choice) ([]geo.POP, string) {
	st, cat := s.steer, s.cfg.CatalogueData
	if len(cat.Steering.Preferred(loc.Country)) > 0 {
		return cat.ChoosePOPsFor(loc, 2, s.cfg.POPUp), reasonOverride
	}
	if st.disabled {
		return cat.ChoosePOPsFor(loc, 2, s.cfg.POPUp), steer.ByDistance.String()
	}
	cands := cat.ChoosePOPsFor(loc, st.table.Config().Candidates, s.cfg.POPUp)
	if len(cands) == 0 {
		return nil, ""
	}
	var ids [8]uint16
	n := min(len(cands), len(ids))
	for i := range n {
		ids[i] = cands[i].ID
	}
	c := st.table.Choose(key, ids[:n])
	pops := []geo.POP{cands[c.First]}
	if c.Backup >= 0 {
		pops = append(pops, cands[c.Backup])
	}
	if c.Reason != steer.ByDistance {
		st.preferRegion(choice, pops[0].ID)
	}
	return pops, c.Reason.String()
}

// pinned is the up POPs of the most specific pin holding ip, if any, with
// a backup from the pin's other POPs when only one is up (withBackup).
func (st *steering) pinned(ip netip.Addr, up func(uint16) bool) []geo.POP {
	ip = ip.Unmap()
	for _, p := range st.pins {
		if !p.prefix.Contains(ip) {
			continue
		}
		var out []geo.POP
		for _, pop := range p.pops {
			if up == nil || up(pop.ID) {
				out = append(out, pop)
			}
		}
		if len(out) > 2 {
			out = out[:2]
		}
		return withBackup(out, p.pops)
	}
	return nil
}

// preferRegion moves the clusters of pop's region to the front, keeping
// the order otherwise.
func (st *steering) preferRegion(choice *geo.Choice, pop uint16) {
	region := st.region[pop]
	slices.SortStableFunc(choice.Clusters, func(a, b geo.ClusterChoice) int {
		return bool2int(b.Region == region) - bool2int(a.Region == region)
	})
}

func bool2int(b bool) int {
	if b {
		return 1
	}
	return 0
}

// setSteerKeys makes keys the source of the steering signer and
// verifier (see steering.keys); call before gossip delivers messages.
func (s *Server) setSteerKeys(keys func() (*steer.Signer, *steer.Verifier)) { s.steer.keys = keys }

// receiveSamples takes a samples message from the gossip pool (runs on
// its packet goroutine: no blocking). Each counts as its reporter's: the
// pod a cluster relay checked and stamped (pods are not in the global
// pool), or the probe key another replica took them from. Any member
// holding the pool's key can send one, so with the deployment authority
// it is believed only under its reporter's role key (steer.Verifier):
// a pod's from its own cluster's relays, a probe's from signaling; a
// pod of a cluster the catalogue lacks, or a POP it lacks, is refused
// too. A message refused is dropped whole and counted by reason.
func (s *Server) receiveSamples(msg []byte) {
	if len(msg) == 0 || msg[0] != steer.MsgKind {
		return
	}
	m, err := steer.ParseMessage(msg)
	if err != nil {
		s.steer.dropped.WithLabelValues(steer.DropInvalid.String()).Inc()
		return
	}
	if d := s.steer.believe(&m); d != steer.Accepted {
		s.steer.dropped.WithLabelValues(d.String()).Inc()
		return
	}
	s.steer.add(m.Source, m.From, m.Samples)
}

// believe says whether to take m, or why not.
func (st *steering) believe(m *steer.Message) steer.Drop {
	var v *steer.Verifier
	if st.keys != nil {
		_, v = st.keys()
	}
	if d := v.Verify(m, st.now()); d != steer.Accepted {
		return d
	}
	if m.Source == steer.SourcePod && !st.clusters[m.From.Cluster()] {
		return steer.DropUnknown
	}
	if st.known(m.Samples) != nil {
		return steer.DropInvalid
	}
	return steer.Accepted
}

func (st *steering) known(samples []steer.Sample) error {
	for _, x := range samples {
		if _, ok := st.region[x.POP]; !ok {
			return fmt.Errorf("POP %d is not in the catalogue", x.POP)
		}
	}
	return nil
}

func (st *steering) add(src steer.Source, from steer.Reporter, samples []steer.Sample) {
	for _, x := range samples {
		result := "accepted"
		if st.table.Add(x, from) != nil {
			result = "invalid"
		}
		st.samples.WithLabelValues(src.String(), result).Inc()
	}
}

// ProbeSamples is the body of POST /v1/steering/samples: round trips a
// synthetic client measured through POPs, by POP name.
type ProbeSamples struct {
	Samples []ProbeSample `json:"samples"`
}

// ProbeSample is one measured round trip.
type ProbeSample struct {
	POP   string  `json:"pop"`
	RTTMs float64 `json:"rtt_ms"`
}

// maxProbeSamples bounds one POST.
const maxProbeSamples = 32

// handleSamples takes a probe's samples: only an API key marked probe may
// post them, they count for the prefix and location the request comes
// from, as an offer from the same place would be keyed, and all of one
// key's count as one reporter's (its newest per POP).
func (s *Server) handleSamples(w http.ResponseWriter, r *http.Request) {
	loc, cred, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	if cred.kind != credAPIKey || !s.keys[cred.key].Probe {
		apierr.Write(w, http.StatusForbidden, apierr.TypeAuthentication, "not_a_probe", "only a probe's API key (probe: true) may post round trips", 0)
		return
	}
	var body ProbeSamples
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || len(body.Samples) == 0 || len(body.Samples) > maxProbeSamples {
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_samples",
			fmt.Sprintf("want {\"samples\": [{\"pop\": name, \"rtt_ms\": ms}, …]} with 1..%d samples", maxProbeSamples), 0)
		return
	}
	key := keyOf(loc)
	samples := make([]steer.Sample, 0, len(body.Samples))
	var errs []error
	for _, p := range body.Samples {
		pop, ok := s.steer.byName[p.POP]
		x := steer.Sample{Key: key, POP: pop.ID, RTT: time.Duration(p.RTTMs * float64(time.Millisecond))}
		if !ok || x.RTT <= 0 || x.RTT > steer.MaxRTT {
			errs = append(errs, fmt.Errorf("pop %q, rtt_ms %v", p.POP, p.RTTMs))
			continue
		}
		samples = append(samples, x)
	}
	if err := errors.Join(errs...); err != nil {
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_samples", "unknown POP or round trip out of range: "+err.Error(), 0)
		return
	}
	from := steer.ProbeReporter(s.keys[cred.key].Key)
	s.steer.add(steer.SourceProbe, from, samples)
	s.steer.passOn(from, samples)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(map[string]any{"accepted": len(samples), "key": key.String()})
}

// passOn sends a probe's samples to the other replicas, signed with the
// signaling key when this replica holds it.
func (st *steering) passOn(from steer.Reporter, samples []steer.Sample) {
	if st.fanOut == nil {
		return
	}
	var sg *steer.Signer
	if st.keys != nil {
		sg, _ = st.keys()
	}
	msg, _ := steer.AppendMessage(nil, sg, st.now(), steer.SourceProbe, from, samples) // 32 samples fit
	st.fanOut(msg)
}

// SteeringView is the answer of GET /v1/steering: what this replica's
// table says of the caller's own key (or of ?ip=&lat=&lon=), per POP.
type SteeringView struct {
	Key  string         `json:"key"`
	POPs []SteeringStat `json:"pops"`
}

// SteeringStat is the table's view of one POP.
type SteeringStat struct {
	POP      string  `json:"pop"`
	MedianMs float64 `json:"median_ms"`
	Samples  int     `json:"samples"`
}

// handleSteeringView shows the table for a key; a probe's API key only.
func (s *Server) handleSteeringView(w http.ResponseWriter, r *http.Request) {
	loc, cred, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	if cred.kind != credAPIKey || !s.keys[cred.key].Probe {
		apierr.Write(w, http.StatusForbidden, apierr.TypeAuthentication, "not_a_probe", "only a probe's API key (probe: true) may read the steering table", 0)
		return
	}
	key := keyOf(loc)
	if q := r.URL.Query(); q.Get("ip") != "" {
		ip, err := netip.ParseAddr(q.Get("ip"))
		var lat, lon float64
		_, errLoc := fmt.Sscanf(q.Get("lat")+" "+q.Get("lon"), "%g %g", &lat, &lon)
		if err != nil {
			apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_ip", "ip is not an address", "ip")
			return
		}
		key = steer.KeyFor(ip, errLoc == nil, lat, lon)
	}
	out := SteeringView{Key: key.String(), POPs: []SteeringStat{}}
	for _, rg := range s.cfg.CatalogueData.Regions {
		for _, p := range rg.POPs {
			stat := s.steer.table.Lookup(key, p.ID)
			out.POPs = append(out.POPs, SteeringStat{POP: p.Name, MedianMs: float64(stat.Median) / float64(time.Millisecond), Samples: stat.Fresh})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
