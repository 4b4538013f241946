package devworld

import (
	"fmt"
	"net/netip"
	"strconv"
)

// Fault injection for failure tests and the soak run: components die
// without goodbye (Kill) and come back as new processes would, with new
// sockets and a new gossip identity.

// RestartClusterRelay kills cluster relay j of region i and starts a new
// replica in its place (new data and API addresses), joining through the
// region's first pod and the world's global seeds (signaling's among them). The catalogue's session
// API for the cluster stays the first replica's address: restart another
// one, or expect signaling to use the fronts gossip reports.
func (w *World) RestartClusterRelay(i, j int) error {
	rg := w.Regions[i]
	rg.ClusterRelays[j].Kill()
	rg.crGen = max(rg.crGen, 1) + 1 // generation 1 started with the world
	cr, err := w.startClusterRelayGen(rg.Spec, j+1, rg.crGen,
		[]string{rg.Pods[0].Pool.LocalAddr().String()}, w.globalSeed)
	if err != nil {
		return err
	}
	rg.ClusterRelays[j] = cr
	return nil
}

// KillPOP kills every global relay replica of region i's POP: the POP's
// address answers nothing until StartPOP.
func (w *World) KillPOP(i int) {
	rg := w.Regions[i]
	for _, rep := range rg.POPReplicas {
		rep.Kill()
	}
	rg.POPReplicas = nil
}

// StartPOP starts a global relay replica of region i's POP on its public
// address after KillPOP, and returns once it is ready.
func (w *World) StartPOP(i int) error {
	rg := w.Regions[i]
	if len(rg.POPReplicas) > 0 {
		return fmt.Errorf("devworld: POP %s is running", rg.Spec.POPName)
	}
	public := netip.AddrPortFrom(rg.Spec.POPIP, rg.GlobalRelay.PublicAddr().Port())
	_, err := w.startPOPReplica(rg, public)
	return err
}

// crName is the node name of a cluster relay replica of generation gen
// (1: started with the world).
func crName(spec RegionSpec, replica, gen int) string {
	name := spec.Name + "/clusterrelay-" + strconv.Itoa(replica)
	if gen > 1 {
		name += "#" + strconv.Itoa(gen)
	}
	return name
}
