package metacheck

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// places is a catalogue of two regions: cluster 1 and POP 1 in eu,
// cluster 2 and POP 2 in us.
type places struct {
	clusters map[uint16]string
	pops     map[uint16]bool
}

func (p places) ClusterRegion(id uint16) (string, bool) {
	r, ok := p.clusters[id]
	return r, ok
}

func (p places) HasPOP(id uint16) bool { return p.pops[id] }

func testCatalogue() Catalogue {
	return places{clusters: map[uint16]string{1: "eu", 2: "us"}, pops: map[uint16]bool{1: true, 2: true}}
}

func TestCheck(t *testing.T) {
	check := New(testCatalogue(), Bounds{})
	tests := []struct {
		name string
		meta membership.Meta
		ok   bool
	}{
		{"cluster relay", membership.Meta{Role: membership.RoleClusterRelay, Region: "eu", Cluster: 1, Capacity: 500, Load: 20}, true},
		{"unknown cluster", membership.Meta{Role: membership.RoleClusterRelay, Cluster: 9, Capacity: 500}, false},
		{"cluster in another region", membership.Meta{Role: membership.RoleClusterRelay, Region: "us", Cluster: 1}, false},
		{"huge capacity", membership.Meta{Role: membership.RoleClusterRelay, Cluster: 1, Capacity: 10_000_000}, false},
		{"negative load", membership.Meta{Role: membership.RoleClusterRelay, Cluster: 1, Load: -1}, false},
		{"pod", membership.Meta{Role: membership.RoleTransceiver, Cluster: 2, Pod: 3, Capacity: 500}, true},
		{"pod over the pod bound", membership.Meta{Role: membership.RoleTransceiver, Cluster: 2, Capacity: 50_000}, false},
		{"global relay", membership.Meta{Role: membership.RoleGlobalRelay, POP: 2}, true},
		{"unknown POP", membership.Meta{Role: membership.RoleGlobalRelay, POP: 7}, false},
		{"signaling", membership.Meta{Role: membership.RoleSignaling}, true},
		{"unknown role", membership.Meta{Role: "mystery"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := check(tc.meta)
			if (err == nil) != tc.ok {
				t.Fatalf("check = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrRefused) {
				t.Fatalf("error %v is not ErrRefused", err)
			}
		})
	}
}

func TestAPIAllowed(t *testing.T) {
	type cluster struct {
		sessionAPI string
		nets       []netip.Prefix
	}
	eu := cluster{"http://clusterapi.eu.svc:8081", []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	us := cluster{"http://127.0.0.1:8081", nil}
	tests := []struct {
		name     string
		c        cluster
		endpoint string
		ok       bool
	}{
		{"inside session_api_nets", eu, "http://10.1.4.7:8081", true},
		{"outside session_api_nets", eu, "http://10.2.4.7:8081", false},
		{"the catalogue's host", eu, "https://clusterapi.eu.svc:9000", true},
		{"another name", eu, "http://evil.example:8081", false},
		{"same host, other port (replicas of a dev world)", us, "http://127.0.0.1:9999", true},
		{"another loopback address", us, "http://127.0.0.2:8081", false},
		{"not http", eu, "ftp://10.1.4.7/", false},
		{"with credentials", eu, "http://user@10.1.4.7:8081", false},
		{"garbage", eu, "::", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := APIAllowed(tc.c.sessionAPI, tc.c.nets, tc.endpoint); got != tc.ok {
				t.Fatalf("APIAllowed(%s) = %v, want %v", tc.endpoint, got, tc.ok)
			}
		})
	}
}

func TestOfClusterAndBounded(t *testing.T) {
	own, global := OfCluster(3, Bounds{}), Bounded(Bounds{})
	tests := []struct {
		name  string
		check func(membership.Meta) error
		meta  membership.Meta
		ok    bool
	}{
		{"pod of the cluster", own, membership.Meta{Role: membership.RoleTransceiver, Cluster: 3, Capacity: 500}, true},
		{"relay of the cluster", own, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 3, Capacity: 5000}, true},
		{"pod of another cluster", own, membership.Meta{Role: membership.RoleTransceiver, Cluster: 4, Capacity: 500}, false},
		{"pod with a huge capacity", own, membership.Meta{Role: membership.RoleTransceiver, Cluster: 3, Capacity: 1_000_000}, false},
		{"global relay in a cluster pool", own, membership.Meta{Role: membership.RoleGlobalRelay, Cluster: 3}, false},
		{"global pool relay", global, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 9, Capacity: 5000}, true},
		{"global pool huge capacity", global, membership.Meta{Role: membership.RoleClusterRelay, Capacity: 5_000_000}, false},
		{"global pool unknown role", global, membership.Meta{Role: "x"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.check(tc.meta); (err == nil) != tc.ok {
				t.Fatalf("check = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
