// What the API server holds, read back after each step: every object of
// the kinds the modules create, with its UID (a new UID = replaced) and,
// for workloads, the pod template's generation, annotations and image (a
// changed template = the pods roll).

package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// partOf selects the objects the modules label as rtcedge's.
const partOf = "app.kubernetes.io/part-of=rtcedge"

// object is one object as the API server holds it.
type object struct {
	uid types.UID
	// Workloads only: their pod template.
	generation  int64
	annotations map[string]string
	image       string
}

// inventory lists the objects of the modules' kinds in namespace ns ("" =
// all) matching selector ("" = all), by "Kind ns/name" (namespaces by
// "Namespace name").
func inventory(ctx context.Context, c kubernetes.Interface, ns, selector string) (map[string]object, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	out := map[string]object{}
	add := func(kind string, m metav1.ObjectMeta) {
		key := kind + " " + m.Namespace + "/" + m.Name
		if m.Namespace == "" {
			key = kind + " " + m.Name
		}
		out[key] = object{uid: m.UID}
	}
	addWorkload := func(kind string, m metav1.ObjectMeta, tmpl corev1.PodTemplateSpec) {
		image := ""
		if len(tmpl.Spec.Containers) > 0 {
			image = tmpl.Spec.Containers[0].Image
		}
		out[kind+" "+m.Namespace+"/"+m.Name] = object{uid: m.UID, generation: m.Generation, annotations: tmpl.Annotations, image: image}
	}
	core, apps := c.CoreV1(), c.AppsV1()
	cms, err := core.ConfigMaps(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range cms.Items {
		add("ConfigMap", o.ObjectMeta)
	}
	secrets, err := core.Secrets(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range secrets.Items {
		add("Secret", o.ObjectMeta)
	}
	svcs, err := core.Services(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range svcs.Items {
		add("Service", o.ObjectMeta)
	}
	deps, err := apps.Deployments(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range deps.Items {
		addWorkload("Deployment", o.ObjectMeta, o.Spec.Template)
	}
	sets, err := apps.StatefulSets(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range sets.Items {
		addWorkload("StatefulSet", o.ObjectMeta, o.Spec.Template)
	}
	pdbs, err := c.PolicyV1().PodDisruptionBudgets(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range pdbs.Items {
		add("PodDisruptionBudget", o.ObjectMeta)
	}
	nps, err := c.NetworkingV1().NetworkPolicies(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range nps.Items {
		add("NetworkPolicy", o.ObjectMeta)
	}
	if ns != "" {
		return out, nil
	}
	nss, err := core.Namespaces().List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	for _, o := range nss.Items {
		add("Namespace", o.ObjectMeta)
	}
	return out, nil
}

// workloads returns the keys of the Deployments and StatefulSets in inv.
func workloads(inv map[string]object) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(inv)) {
		if strings.HasPrefix(k, "Deployment ") || strings.HasPrefix(k, "StatefulSet ") {
			out = append(out, k)
		}
	}
	return out
}

// kinds counts inv's objects by kind, as "Kind=N, ...".
func kinds(inv map[string]object) string {
	n := map[string]int{}
	for k := range inv {
		kind, _, _ := strings.Cut(k, " ")
		n[kind]++
	}
	var parts []string
	for _, kind := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s=%d", kind, n[kind]))
	}
	return strings.Join(parts, ", ")
}

// change is what happened to the workloads between two inventories.
type change struct {
	rolled, unchanged, replaced []string // workload keys
	otherReplaced               []string // non-workload keys with a new UID
	gone, added                 []string
}

// compare tells, for every object in before, whether it is still there
// under the same UID, and for workloads whether their pod template changed.
func compare(before, after map[string]object) change {
	var ch change
	for _, k := range slices.Sorted(maps.Keys(before)) {
		b := before[k]
		a, ok := after[k]
		switch {
		case !ok:
			ch.gone = append(ch.gone, k)
		case a.uid != b.uid && isWorkload(k):
			ch.replaced = append(ch.replaced, k)
		case a.uid != b.uid:
			ch.otherReplaced = append(ch.otherReplaced, k)
		case !isWorkload(k):
		case a.image != b.image || !maps.Equal(a.annotations, b.annotations):
			ch.rolled = append(ch.rolled, k)
		default:
			ch.unchanged = append(ch.unchanged, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[k]; !ok {
			ch.added = append(ch.added, k)
		}
	}
	return ch
}

func isWorkload(key string) bool {
	return strings.HasPrefix(key, "Deployment ") || strings.HasPrefix(key, "StatefulSet ")
}

// templateDiff names what changed in a workload's pod template.
func templateDiff(b, a object) string {
	var parts []string
	if a.image != b.image {
		parts = append(parts, "image "+b.image+" -> "+a.image)
	}
	for _, k := range slices.Sorted(maps.Keys(a.annotations)) {
		if a.annotations[k] != b.annotations[k] {
			parts = append(parts, k)
		}
	}
	return strings.Join(parts, ", ")
}
