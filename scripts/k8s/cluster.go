// The cluster under test: etcd (Debian's etcd-server) and a kube-apiserver
// built from k8s.io/kubernetes through the module proxy (this module's
// tool), both on loopback ports, in a temporary directory removed on stop.

package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// cluster is a running etcd and kube-apiserver. Static after start.
type cluster struct {
	dir        string // temporary: data, certificates, logs, kubeconfig
	kubeconfig string
	client     kubernetes.Interface
	procs      []*proc // started order; stopped in reverse
}

// proc is one started process; done closes once it has exited and been
// reaped.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// freePort returns a loopback TCP port free a moment ago: etcd and the API
// server take a port, not a listener.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs a binary with its output in dir/<name>.log.
func (c *cluster) start(name, bin string, args ...string) error {
	log, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	c.procs = append(c.procs, p)
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return nil
}

// startCluster starts etcd and the API server in dir and waits until the
// API server is ready (within timeout).
func startCluster(ctx context.Context, dir, etcd, apiserver string, timeout time.Duration) (*cluster, error) {
	c := &cluster{dir: dir, kubeconfig: filepath.Join(dir, "kubeconfig")}
	ports := make([]int, 3)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	client, peer, secure := ports[0], ports[1], ports[2]
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(client)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	if err := c.start("etcd", etcd, "--name", "test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL); err != nil {
		return nil, err
	}
	token, err := c.credentials()
	if err != nil {
		c.stop()
		return nil, err
	}
	if err := c.start("kube-apiserver", apiserver,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", strconv.Itoa(secure),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(dir, "sa.pem"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.pem"),
		"--service-cluster-ip-range", "10.96.0.0/16"); err != nil {
		c.stop()
		return nil, err
	}
	server := "https://127.0.0.1:" + strconv.Itoa(secure)
	if err := c.awaitReady(ctx, server, token, timeout); err != nil {
		c.stop()
		return nil, err
	}
	if err := c.writeKubeconfig(server, token); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// credentials writes the API server's token file (one admin in
// system:masters) and service-account signing key; it returns the token.
func (c *cluster) credentials() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	token := hex.EncodeToString(b)
	if err := os.WriteFile(filepath.Join(c.dir, "tokens.csv"), []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("service-account key: %w", err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(c.dir, "sa.pem"), pemKey, 0o600); err != nil {
		return "", fmt.Errorf("service-account key file: %w", err)
	}
	return token, nil
}

// awaitReady polls /readyz until it answers 200. The API server's
// certificate is its own self-signed one, on loopback: not verified.
func (c *cluster) awaitReady(ctx context.Context, server, token string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		for _, p := range c.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited (%v): see %s", p.name, p.cmd.ProcessState, filepath.Join(c.dir, p.name+".log"))
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %v (last: %v)", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// writeKubeconfig writes the kubeconfig Terraform's provider and this
// program use, and makes the client.
func (c *cluster) writeKubeconfig(server, token string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, server, token)
	if err := os.WriteFile(c.kubeconfig, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// The stand-in lists every 200 ms: above client-go's default rate.
	rc.QPS, rc.Burst = 100, 200
	c.client, err = kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}

// stop ends the processes in reverse order, each by SIGTERM and, after 20
// s, SIGKILL, and waits for each to exit.
func (c *cluster) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	c.procs = nil
}
