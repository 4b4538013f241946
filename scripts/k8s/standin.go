// The controllers' stand-in: the cluster under test has an API server and
// nothing else (no controller manager, scheduler, kubelet or cloud load
// balancer), so nothing would ever report a rollout done, a load balancer
// provisioned or a namespace emptied, and the provider waits for all three.
// The stand-in writes those reports; what it cannot vouch for it leaves
// alone: a namespace that still holds objects is never finalized, so a
// destroy that leaves objects behind times out and fails.

package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// lbAddress is the address the stand-in reports for a LoadBalancer Service
// without load_balancer_ip (documentation range: nothing is sent to it).
const lbAddress = "192.0.2.1"

// standIn reports rollouts, load balancers and emptied namespaces.
type standIn struct {
	client kubernetes.Interface

	mu      sync.Mutex // guards lastErr
	lastErr error
}

// run reports every 200 ms until ctx ends.
func (s *standIn) run(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		err := s.once(ctx)
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// err is the last pass's error, for a failing step's report.
func (s *standIn) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// once makes one pass over Deployments, StatefulSets, Services and
// terminating namespaces.
func (s *standIn) once(ctx context.Context) error {
	apps := s.client.AppsV1()
	deps, err := apps.Deployments("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list deployments: %w", err)
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		n := replicas(d.Spec.Replicas)
		if d.Status.ObservedGeneration == d.Generation && d.Status.AvailableReplicas == n && d.Status.Replicas == n {
			continue
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n}
		if _, err := apps.Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("deployment %s/%s status: %w", d.Namespace, d.Name, err)
		}
	}
	sets, err := apps.StatefulSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list statefulsets: %w", err)
	}
	for i := range sets.Items {
		ss := &sets.Items[i]
		n, rev := replicas(ss.Spec.Replicas), fmt.Sprintf("%s-%d", ss.Name, ss.Generation)
		if ss.Status.ObservedGeneration == ss.Generation && ss.Status.UpdateRevision == rev && ss.Status.ReadyReplicas == n {
			continue
		}
		ss.Status = appsv1.StatefulSetStatus{ObservedGeneration: ss.Generation, Replicas: n, ReadyReplicas: n, CurrentReplicas: n,
			UpdatedReplicas: n, AvailableReplicas: n, CurrentRevision: rev, UpdateRevision: rev}
		if _, err := apps.StatefulSets(ss.Namespace).UpdateStatus(ctx, ss, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("statefulset %s/%s status: %w", ss.Namespace, ss.Name, err)
		}
	}
	if err := s.loadBalancers(ctx); err != nil {
		return err
	}
	return s.finalizeEmptied(ctx)
}

func replicas(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// loadBalancers gives every LoadBalancer Service an ingress address: its
// load_balancer_ip, else lbAddress.
func (s *standIn) loadBalancers(ctx context.Context) error {
	core := s.client.CoreV1()
	svcs, err := core.Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	for i := range svcs.Items {
		svc := &svcs.Items[i]
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Status.LoadBalancer.Ingress) > 0 {
			continue
		}
		ip := svc.Spec.LoadBalancerIP
		if ip == "" {
			ip = lbAddress
		}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		if _, err := core.Services(svc.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("service %s/%s status: %w", svc.Namespace, svc.Name, err)
		}
	}
	return nil
}

// finalizeEmptied removes the finalizer of every terminating namespace that
// holds none of the kinds the modules create (what the namespace controller
// does once it has deleted them).
func (s *standIn) finalizeEmptied(ctx context.Context) error {
	nss, err := s.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	for i := range nss.Items {
		ns := &nss.Items[i]
		if ns.DeletionTimestamp == nil || len(ns.Spec.Finalizers) == 0 {
			continue
		}
		left, err := inventory(ctx, s.client, ns.Name, "")
		if err != nil {
			return err
		}
		if len(left) > 0 {
			continue
		}
		ns.Spec.Finalizers = nil
		if _, err := s.client.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("finalize namespace %s: %w", ns.Name, err)
		}
	}
	return nil
}
