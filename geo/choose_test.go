package geo

import (
	"cmp"
	"net/netip"
	"slices"
	"testing"
)

func loadSample(t *testing.T) *Catalogue {
	t.Helper()
	c, err := LoadCatalogue("testdata/catalogue.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func clusterIDs(ch Choice) []uint16 {
	var ids []uint16
	for _, c := range ch.Clusters {
		ids = append(ids, c.Cluster.ID)
	}
	return ids
}

func popIDs(pops []POP) []uint16 {
	var ids []uint16
	for _, p := range pops {
		ids = append(ids, p.ID)
	}
	return ids
}

// TestChooseFromFixtureIPs runs the whole path signaling uses: locate a
// fixture address with the embedded database, then choose.
func TestChooseFromFixtureIPs(t *testing.T) {
	cat := loadSample(t)
	loc, err := NewLocator(LocatorConfig{DB: DevGeoIPDB, Default: cat.DefaultLocation()})
	if err != nil {
		t.Fatal(err)
	}
	defer loc.Close()

	tests := []struct {
		ip         string
		wantSource string
		wantRegion string
		clusters   []uint16
		pops       []uint16
	}{
		{"192.0.2.10", SourceGeoIP, "eu-central", []uint16{1, 2, 3}, []uint16{1, 2}},
		{"198.51.100.7", SourceGeoIP, "us-east", []uint16{2, 1, 3}, []uint16{2, 1}},
		{"203.0.113.200", SourceGeoIP, "ap-southeast", []uint16{3, 1, 2}, []uint16{3, 1}},
		{"2001:db8:1::5", SourceGeoIP, "eu-central", []uint16{1, 2, 3}, []uint16{1, 2}},
		{"2001:db8:2:ffff::1", SourceGeoIP, "us-east", []uint16{2, 1, 3}, []uint16{2, 1}},
		{"2001:db8:3::1", SourceGeoIP, "ap-southeast", []uint16{3, 1, 2}, []uint16{3, 1}},
		{"127.0.0.1", SourceDefault, "eu-central", []uint16{1, 2, 3}, []uint16{1, 2}},
		{"10.1.2.3", SourceDefault, "eu-central", []uint16{1, 2, 3}, []uint16{1, 2}},
		{"8.8.8.8", SourceDefault, "eu-central", []uint16{1, 2, 3}, []uint16{1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.ip, func(t *testing.T) {
			l := loc.locateIP(netip.MustParseAddr(tt.ip))
			if l.Source != tt.wantSource {
				t.Fatalf("source %q, want %q", l.Source, tt.wantSource)
			}
			ch := cat.Choose(l.Point, nil)
			if got := clusterIDs(ch); !slices.Equal(got, tt.clusters) {
				t.Errorf("clusters %v, want %v", got, tt.clusters)
			}
			if ch.Clusters[0].Region != tt.wantRegion {
				t.Errorf("region %q, want %q", ch.Clusters[0].Region, tt.wantRegion)
			}
			if !slices.IsSortedFunc(ch.Clusters, func(a, b ClusterChoice) int {
				return cmp.Compare(a.DistanceKm, b.DistanceKm)
			}) {
				t.Errorf("clusters not sorted by distance: %+v", ch.Clusters)
			}
			if got := popIDs(ch.POPs); !slices.Equal(got, tt.pops) {
				t.Errorf("pops %v, want %v", got, tt.pops)
			}
		})
	}
}

func TestChooseHealth(t *testing.T) {
	cat := loadSample(t)
	fra := Point{50.11, 8.68}
	tests := []struct {
		name   string
		states map[uint16]ClusterState // absent = unknown
		want   []uint16
	}{
		{"nil-equivalent: all unknown", nil, []uint16{1, 2, 3}},
		{"all healthy", map[uint16]ClusterState{1: {Healthy: true}, 2: {Healthy: true}, 3: {Healthy: true}}, []uint16{1, 2, 3}},
		{"nearest unhealthy", map[uint16]ClusterState{1: {}}, []uint16{2, 3}},
		{"nearest draining", map[uint16]ClusterState{1: {Healthy: true, Draining: true}}, []uint16{2, 3}},
		{"nearest full", map[uint16]ClusterState{1: {Healthy: true, Load: 10, Capacity: 10}}, []uint16{2, 3}},
		{"over capacity", map[uint16]ClusterState{1: {Healthy: true, Load: 11, Capacity: 10}}, []uint16{2, 3}},
		{"room left", map[uint16]ClusterState{1: {Healthy: true, Load: 9, Capacity: 10}}, []uint16{1, 2, 3}},
		{"unlimited capacity", map[uint16]ClusterState{1: {Healthy: true, Load: 1e6}}, []uint16{1, 2, 3}},
		{"all unusable", map[uint16]ClusterState{
			1: {}, 2: {Healthy: true, Draining: true}, 3: {Healthy: true, Load: 1, Capacity: 1},
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			health := func(id uint16) (ClusterState, bool) {
				s, ok := tt.states[id]
				return s, ok
			}
			ch := cat.Choose(fra, health)
			if got := clusterIDs(ch); !slices.Equal(got, tt.want) {
				t.Errorf("clusters %v, want %v", got, tt.want)
			}
			if len(ch.Clusters) != len(tt.want) {
				t.Errorf("len(Clusters) = %d, want %d", len(ch.Clusters), len(tt.want))
			}
			// POP choice does not depend on cluster health.
			if got := popIDs(ch.POPs); !slices.Equal(got, []uint16{1, 2}) {
				t.Errorf("pops %v", got)
			}
		})
	}
	if got := clusterIDs(cat.Choose(fra, nil)); !slices.Equal(got, []uint16{1, 2, 3}) {
		t.Errorf("nil HealthFunc: clusters %v", got)
	}
}

func TestChoosePOPs(t *testing.T) {
	cat := loadSample(t)
	sin := Point{1.35, 103.82}
	tests := []struct {
		name string
		n    int
		down []uint16
		want []uint16
	}{
		{"nearest one", 1, nil, []uint16{3}},
		{"nearest two", 2, nil, []uint16{3, 1}},
		{"all", 0, nil, []uint16{3, 1, 2}},
		{"more than exist", 5, nil, []uint16{3, 1, 2}},
		{"nearest down", 2, []uint16{3}, []uint16{1, 2}},
		{"all down", 2, []uint16{1, 2, 3}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := func(id uint16) bool { return !slices.Contains(tt.down, id) }
			if got := popIDs(cat.ChoosePOPs(sin, tt.n, up)); !slices.Equal(got, tt.want) {
				t.Errorf("pops %v, want %v", got, tt.want)
			}
		})
	}
}

func TestChooseTiesByID(t *testing.T) {
	here := Point{10, 10}
	cat := &Catalogue{DefaultRegion: "r", Regions: []Region{{
		Name: "r", Location: here,
		Clusters: []Cluster{{ID: 9, Name: "b", Location: here}, {ID: 4, Name: "a", Location: here}},
		POPs: []POP{
			{ID: 7, Name: "y", VIP: netip.MustParseAddrPort("192.0.2.1:3478"), Location: here},
			{ID: 5, Name: "x", VIP: netip.MustParseAddrPort("192.0.2.2:3478"), Location: here},
		},
	}}}
	ch := cat.Choose(here, nil)
	if got := clusterIDs(ch); !slices.Equal(got, []uint16{4, 9}) {
		t.Errorf("clusters %v", got)
	}
	if got := popIDs(ch.POPs); !slices.Equal(got, []uint16{5, 7}) {
		t.Errorf("pops %v", got)
	}
}
