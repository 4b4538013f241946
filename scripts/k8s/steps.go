// The steps of the test, each checked against what the API server holds.

package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// finalVars are the inputs after the last in-place step.
var finalVars = []string{"-var=image_version=v1.0.1", "-var=key_generation=2", "-var=issuer_generation=2", "-var=sip_tls_generation=2"}

// steps runs refusal, create, upgrade, rotations, a certificate renewal, a
// replacement plan and destroy, in that order.
func steps(ctx context.Context, c *cluster, tf *tofu) error {
	if err := refusals(ctx, c, tf); err != nil {
		return err
	}
	created, err := create(ctx, c, tf)
	if err != nil {
		return err
	}
	// Redis runs its own image and reads no key: neither step rolls it.
	notRedis := func(k string) bool { return !strings.HasSuffix(k, "/rtcedge-redis") }
	upgraded, err := inPlace(ctx, c, tf, "upgrade (image v1.0.1)", created, notRedis, []string{"-var=image_version=v1.0.1"})
	if err != nil {
		return err
	}
	rotated, err := inPlace(ctx, c, tf, "rotation (key_generation 2)", upgraded, notRedis,
		[]string{"-var=image_version=v1.0.1", "-var=key_generation=2"})
	if err != nil {
		return err
	}
	issued, err := inPlace(ctx, c, tf, "issuer rotation (issuer_generation 2)", rotated, func(k string) bool { return strings.HasSuffix(k, "/transceiver") },
		[]string{"-var=image_version=v1.0.1", "-var=key_generation=2", "-var=issuer_generation=2"})
	if err != nil {
		return err
	}
	// The SIP front's certificate is read once at start: its renewal
	// rolls the front, and nothing else.
	if _, err := inPlace(ctx, c, tf, "SIP certificate renewal (sip_tls_generation 2)", issued, func(k string) bool { return strings.HasSuffix(k, "/sipfront") },
		finalVars); err != nil {
		return err
	}
	if err := replacing(ctx, tf); err != nil {
		return err
	}
	return destroy(ctx, c, tf)
}

// refusals: names one character over the limits fail plan, with the
// validation's message, and nothing is created.
func refusals(ctx context.Context, c *cluster, tf *tofu) error {
	for _, tc := range []struct{ arg, says string }{
		{"-var=pop_name=" + strings.Repeat("p", 52), "at most 51"},
		{"-var=region=" + strings.Repeat("r", 56), "at most 55"},
		{"-var=sip_trunk_cidr=203.0.113.0/33", "must be CIDRs"},
	} {
		out, err := tf.run(ctx, "plan", "-input=false", "-no-color", tc.arg)
		if err == nil {
			return fmt.Errorf("plan with %s passed: want it refused", tc.arg[:20]+"…")
		}
		if !strings.Contains(out, "Invalid value for variable") || !strings.Contains(out, tc.says) {
			return fmt.Errorf("plan with %s failed, but not by the validation saying %q:\n%s", tc.arg[:20]+"…", tc.says, tail(out, 20))
		}
		fmt.Printf("test-k8s: plan refuses %s… (%q)\n", tc.arg[:20], tc.says)
	}
	inv, err := inventory(ctx, c.client, "", partOf)
	if err != nil {
		return err
	}
	if len(inv) > 0 {
		return fmt.Errorf("refused plans left objects: %v", inv)
	}
	return nil
}

// create applies the root module and checks every resource in the state is
// an object in the API server.
func create(ctx context.Context, c *cluster, tf *tofu) (map[string]object, error) {
	p, err := tf.plan(ctx)
	if err != nil {
		return nil, err
	}
	if err := tf.apply(ctx); err != nil {
		return nil, err
	}
	inv, err := inventory(ctx, c.client, "", partOf)
	if err != nil {
		return nil, err
	}
	n, err := tf.stateCount(ctx)
	if err != nil {
		return nil, err
	}
	if n != len(inv) || len(p["create"]) != n {
		return nil, fmt.Errorf("apply: planned %d creations, state holds %d resources, the API server %d rtcedge objects (%s)", len(p["create"]), n, len(inv), kinds(inv))
	}
	fmt.Printf("test-k8s: apply created %d objects (%s)\n", len(inv), kinds(inv))
	return inv, nil
}

// inPlace plans and applies vars, and checks that nothing is replaced or
// lost and that exactly the workloads shouldRoll picks have a new pod
// template.
func inPlace(ctx context.Context, c *cluster, tf *tofu, what string, before map[string]object, shouldRoll func(string) bool, vars []string) (map[string]object, error) {
	p, err := tf.plan(ctx, vars...)
	if err != nil {
		return nil, err
	}
	if len(p["replace"])+len(p["delete"])+len(p["create"]) > 0 {
		return nil, fmt.Errorf("%s: plan replaces %v, deletes %v, creates %v: want updates only", what, p["replace"], p["delete"], p["create"])
	}
	if err := tf.apply(ctx); err != nil {
		return nil, err
	}
	after, err := inventory(ctx, c.client, "", partOf)
	if err != nil {
		return nil, err
	}
	ch := compare(before, after)
	if len(ch.replaced)+len(ch.otherReplaced)+len(ch.gone)+len(ch.added) > 0 {
		return nil, fmt.Errorf("%s: replaced %v %v, gone %v, added %v", what, ch.replaced, ch.otherReplaced, ch.gone, ch.added)
	}
	var want, got []string
	for _, k := range workloads(before) {
		if shouldRoll(k) {
			want = append(want, k)
		}
	}
	got = ch.rolled
	if !slices.Equal(got, want) {
		return nil, fmt.Errorf("%s: pod templates changed of %v, want %v", what, got, want)
	}
	fmt.Printf("test-k8s: %s: %d resources updated in place, none replaced; pods roll in:\n", what, len(p["update"]))
	for _, k := range got {
		fmt.Printf("\t%s (generation %d -> %d: %s)\n", k, before[k].generation, after[k].generation, templateDiff(before[k], after[k]))
	}
	fmt.Printf("\tunchanged: %v\n", ch.unchanged)
	return after, nil
}

// replacing plans a cluster_id change (not applied) and reports what it
// would replace: the region's workloads select their pods by the cluster
// label, and a selector cannot change in place.
func replacing(ctx context.Context, tf *tofu) error {
	p, err := tf.plan(ctx, append(finalVars, "-var=cluster_id=2")...)
	if err != nil {
		return err
	}
	var workloads []string
	for _, a := range p["replace"] {
		if strings.Contains(a, "kubernetes_deployment_v1") || strings.Contains(a, "kubernetes_stateful_set_v1") {
			workloads = append(workloads, a)
		}
	}
	if len(workloads) == 0 {
		return fmt.Errorf("a cluster_id change replaces no workload (replaces %v): docs/deploy.md says it does", p["replace"])
	}
	fmt.Printf("test-k8s: a cluster_id change would replace (not applied):\n\t%s\n", strings.Join(p["replace"], "\n\t"))
	return nil
}

// destroy destroys everything and checks nothing is left.
func destroy(ctx context.Context, c *cluster, tf *tofu) error {
	if _, err := tf.run(ctx, append([]string{"destroy", "-auto-approve", "-input=false", "-no-color"}, finalVars...)...); err != nil {
		return err
	}
	inv, err := inventory(ctx, c.client, "", "")
	if err != nil {
		return err
	}
	var left []string
	for k := range inv {
		// What the API server keeps for itself.
		if !strings.Contains(k, " default/kubernetes") && !strings.Contains(k, "kube-") && k != "Namespace default" {
			left = append(left, k)
		}
	}
	n, err := tf.stateCount(ctx)
	if err != nil {
		return err
	}
	if len(left) > 0 || n > 0 {
		return fmt.Errorf("destroy left %v in the API server and %d resources in the state", left, n)
	}
	fmt.Println("test-k8s: destroy removed every object; the state is empty")
	return nil
}
