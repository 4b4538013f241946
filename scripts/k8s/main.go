// Command k8s is `make test-k8s`: it applies, updates, rotates and destroys
// the Terraform modules (root/main.tf: a region and a POP with its SIP front) against a real
// kube-apiserver with etcd, and checks after each step what the API server
// holds:
//
//   - plan refuses names the API server would refuse (a POP name of 52
//     characters, a region of 56) and a SIP trunk's malformed CIDR,
//     before anything is created;
//   - apply creates every object, at the longest accepted names;
//   - an image upgrade updates in place: no object replaced, every
//     workload's pod template changed;
//   - bumping key_generation (every key) rolls every workload that reads a
//     key and no other; bumping issuer_generation rolls the transceivers
//     only; renewing the SIP front's certificate (sip_tls_generation)
//     rolls the SIP front only;
//   - a plan changing cluster_id replaces the region's workloads (listed,
//     not applied: docs/deploy.md, "Inputs that replace workloads");
//   - destroy leaves no object and an empty state.
//
// "Rolls" means the pod template changed under the same object (same UID,
// new generation): there is no scheduler or kubelet, and standin.go reports
// rollouts done in their place. The Kubernetes provider is not served by the
// module proxy; it is built once from its source into -tools (README.md,
// "Testing the Terraform modules").
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// options are the command's flags.
type options struct {
	tools   string // bin/tofu, bin/kube-apiserver, providers/ (the mirror)
	modules string // terraform/modules
	root    string // the root module's directory
	etcd    string
	keep    bool
}

func main() {
	var o options
	flag.StringVar(&o.tools, "tools", "", "directory holding bin/tofu, bin/kube-apiserver and providers/ (an unpacked provider mirror)")
	flag.StringVar(&o.modules, "modules", "", "the repository's terraform/modules")
	flag.StringVar(&o.root, "root", "root", "directory of the test's root module")
	flag.StringVar(&o.etcd, "etcd", "etcd", "etcd binary (Debian: etcd-server)")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory (state, logs) instead of removing it")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 40*time.Minute)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "test-k8s: FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("test-k8s: PASS")
}

// run sets up the cluster and the working directory, then runs the steps.
func run(ctx context.Context, o options) (err error) {
	dir, err := os.MkdirTemp("", "rtcedge-test-k8s-")
	if err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	// Kept when asked or on failure (logs and state to look at).
	defer func() {
		if o.keep || err != nil {
			fmt.Println("test-k8s: kept", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	fmt.Println("test-k8s: starting etcd and kube-apiserver")
	c, err := startCluster(ctx, dir, o.etcd, filepath.Join(o.tools, "bin", "kube-apiserver"), 5*time.Minute)
	if err != nil {
		return err
	}
	defer c.stop()

	sctx, scancel := context.WithCancel(ctx)
	s := &standIn{client: c.client}
	done := make(chan struct{})
	go func() { s.run(sctx); close(done) }()
	defer func() { scancel(); <-done }()

	work := filepath.Join(dir, "root")
	if err := prepareRoot(o, work); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(dir, "tofu.log"))
	if err != nil {
		return fmt.Errorf("tofu log: %w", err)
	}
	defer log.Close()
	tf := &tofu{bin: filepath.Join(o.tools, "bin", "tofu"), dir: work, log: log, env: []string{
		"TF_VAR_kubeconfig=" + c.kubeconfig, "TF_IN_AUTOMATION=1", "TF_CLI_CONFIG_FILE=" + filepath.Join(dir, "tofurc"),
	}}
	if err := os.WriteFile(filepath.Join(dir, "tofurc"), nil, 0o600); err != nil {
		return fmt.Errorf("tofurc: %w", err)
	}
	if _, err := tf.run(ctx, "init", "-input=false", "-no-color", "-plugin-dir="+filepath.Join(o.tools, "providers")); err != nil {
		return err
	}
	if err := steps(ctx, c, tf); err != nil {
		if serr := s.err(); serr != nil {
			err = fmt.Errorf("%w (stand-in: %v)", err, serr)
		}
		return fmt.Errorf("%w\n(logs: %s/*.log)", err, dir)
	}
	return nil
}

// prepareRoot copies the root module into work beside a link "modules" to
// the repository's modules.
func prepareRoot(o options, work string) error {
	if err := os.MkdirAll(work, 0o755); err != nil {
		return fmt.Errorf("root module: %w", err)
	}
	src, err := os.ReadFile(filepath.Join(o.root, "main.tf"))
	if err != nil {
		return fmt.Errorf("root module: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, "main.tf"), src, 0o644); err != nil {
		return fmt.Errorf("root module: %w", err)
	}
	modules, err := filepath.Abs(o.modules)
	if err != nil {
		return fmt.Errorf("modules: %w", err)
	}
	if err := os.Symlink(modules, filepath.Join(work, "modules")); err != nil {
		return fmt.Errorf("modules link: %w", err)
	}
	return nil
}
