// Package metacheck vets gossip metadata against the region catalogue. A
// member of a pool advertises its role, cluster, POP, addresses and
// capacity; whoever holds a pool's key can join and say anything, so what
// routes calls believes only what the catalogue allows: known clusters and
// POPs in their own regions, capacities and loads within bounds, and
// session API endpoints on the networks the catalogue names.
package metacheck

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// Default bounds.
const (
	// DefaultMaxClusterCapacity bounds a cluster relay's aggregate.
	DefaultMaxClusterCapacity = 100_000
	// DefaultMaxPodCapacity bounds one transceiver pod.
	DefaultMaxPodCapacity = 10_000
)

// ErrRefused wraps every refusal.
var ErrRefused = errors.New("metadata not allowed by the catalogue")

// Bounds are the limits on advertised numbers; zero fields take defaults.
type Bounds struct {
	MaxClusterCapacity int
	MaxPodCapacity     int
}

// Catalogue is what the checks need of the region catalogue (geo.Catalogue
// implements it). It is an interface so that this package, below geo in the
// layers, never imports it. Its methods may be called from gossip's
// goroutines at any time.
type Catalogue interface {
	// ClusterRegion returns the name of the region holding cluster id.
	ClusterRegion(id uint16) (region string, ok bool)
	// HasPOP reports whether a POP with the given id exists.
	HasPOP(id uint16) bool
}

// New returns a membership.Config.CheckMeta that refuses metadata the
// catalogue does not allow.
func New(cat Catalogue, b Bounds) func(membership.Meta) error {
	if b.MaxClusterCapacity <= 0 {
		b.MaxClusterCapacity = DefaultMaxClusterCapacity
	}
	if b.MaxPodCapacity <= 0 {
		b.MaxPodCapacity = DefaultMaxPodCapacity
	}
	return func(m membership.Meta) error { return check(cat, b, m) }
}

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

func check(cat Catalogue, b Bounds, m membership.Meta) error {
	if m.Load < 0 || m.Capacity < 0 {
		return refuse("negative load or capacity")
	}
	inCluster := func(max int) error {
		region, ok := cat.ClusterRegion(m.Cluster)
		switch {
		case !ok:
			return refuse("unknown cluster %d", m.Cluster)
		case m.Region != "" && m.Region != region:
			return refuse("cluster %d is in %s, not %s", m.Cluster, region, m.Region)
		case m.Capacity > max || m.Load > max:
			return refuse("capacity %d / load %d over %d", m.Capacity, m.Load, max)
		}
		return nil
	}
	switch m.Role {
	case membership.RoleClusterRelay:
		return inCluster(b.MaxClusterCapacity)
	case membership.RoleTransceiver:
		return inCluster(b.MaxPodCapacity)
	case membership.RoleGlobalRelay:
		if !cat.HasPOP(m.POP) {
			return refuse("unknown POP %d", m.POP)
		}
	case membership.RoleSignaling:
	default:
		return refuse("unknown role %q", m.Role)
	}
	return nil
}

// APIAllowed reports whether a gossiped session API endpoint of a cluster
// may receive offers: an http(s) URL whose host is the host of the
// catalogue's sessionAPI URL for that cluster, or an address inside one of
// its nets (the catalogue's session_api_nets).
func APIAllowed(sessionAPI string, nets []netip.Prefix, endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return false
	}
	host := u.Hostname()
	if cu, err := url.Parse(sessionAPI); err == nil && cu.Hostname() != "" && strings.EqualFold(cu.Hostname(), host) {
		return true
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	for _, p := range nets {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// OfCluster returns a CheckMeta for a cluster's own pool, where no
// catalogue is at hand: every member must be a transceiver or cluster
// relay of that cluster, with a pod's capacity and load within bounds (a
// pod advertising a huge capacity would win every pick of the front).
func OfCluster(cluster uint16, b Bounds) func(membership.Meta) error {
	if b.MaxPodCapacity <= 0 {
		b.MaxPodCapacity = DefaultMaxPodCapacity
	}
	if b.MaxClusterCapacity <= 0 {
		b.MaxClusterCapacity = DefaultMaxClusterCapacity
	}
	return func(m membership.Meta) error {
		max := b.MaxPodCapacity
		switch m.Role {
		case membership.RoleTransceiver:
		case membership.RoleClusterRelay:
			max = b.MaxClusterCapacity
		default:
			return refuse("role %q in a cluster pool", m.Role)
		}
		switch {
		case m.Cluster != cluster:
			return refuse("member of cluster %d in cluster %d's pool", m.Cluster, cluster)
		case m.Load < 0 || m.Capacity < 0 || m.Capacity > max || m.Load > max:
			return refuse("capacity %d / load %d out of [0, %d]", m.Capacity, m.Load, max)
		}
		return nil
	}
}

// Bounded returns a CheckMeta for a global pool member that holds no
// catalogue: known roles only, capacities and loads within bounds.
func Bounded(b Bounds) func(membership.Meta) error {
	if b.MaxClusterCapacity <= 0 {
		b.MaxClusterCapacity = DefaultMaxClusterCapacity
	}
	return func(m membership.Meta) error {
		switch {
		case !slices.Contains(membership.Roles, m.Role):
			return refuse("unknown role %q", m.Role)
		case m.Load < 0 || m.Capacity < 0 || m.Capacity > b.MaxClusterCapacity || m.Load > b.MaxClusterCapacity:
			return refuse("capacity %d / load %d out of [0, %d]", m.Capacity, m.Load, b.MaxClusterCapacity)
		}
		return nil
	}
}
