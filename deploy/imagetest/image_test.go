package imagetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/probe"
)

// runLabel marks every container this test binary starts, so a run killed
// before its cleanups can be swept up by the next one.
const runLabel = "rtcedge.imagetest"

func TestMain(m *testing.M) {
	removeStale()
	goleak.VerifyTestMain(runner{m})
}

// removeStale removes the containers of earlier test binaries that died
// before their cleanups ran; those of test binaries still running (another
// run on the same machine) are left alone.
func removeStale() {
	out, err := exec.Command("podman", "ps", "--all", "--filter", "label="+runLabel,
		"--format", `{{.ID}} {{index .Labels "`+runLabel+`"}}`).Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		id, owner, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if pid, err := strconv.Atoi(owner); err == nil && syscall.Kill(pid, 0) == nil {
			continue // its test binary is alive
		}
		_ = exec.Command("podman", "rm", "--force", "--ignore", "--time", "0", id).Run()
	}
}

// runner removes the image the tests built once they are done.
type runner struct{ m *testing.M }

func (r runner) Run() int {
	code := r.m.Run()
	removeContainers(fmt.Sprintf("label=%s=%d", runLabel, os.Getpid()))
	if built.ref != "" && built.owned {
		_ = exec.Command("podman", "rmi", "--force", built.ref).Run()
	}
	return code
}

// removeContainers force-removes the containers matching a podman filter;
// it is a no-op without podman.
func removeContainers(filter string) {
	out, err := exec.Command("podman", "ps", "--all", "--quiet", "--filter", filter).Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_ = exec.Command("podman", "rm", "--force", "--ignore", "--time", "0", id).Run()
	}
}

// requirePodman fails the test, saying what to install, when podman or runc
// is missing.
func requirePodman(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: the image tests run containers with podman and runc; "+
				"run scripts/test-deps.sh (or apt-get install podman runc)", tool)
		}
	}
}

// built is the image under test, built once per test binary.
var built struct {
	once  sync.Once
	ref   string
	owned bool // built here, so removed at the end
	err   error
}

// image returns the image to test: $RTCEDGE_TEST_IMAGE, or one built now
// with scripts/build-image.sh, the script behind `make image`.
func image(t *testing.T) string {
	t.Helper()
	requirePodman(t)
	built.once.Do(func() {
		if ref := os.Getenv("RTCEDGE_TEST_IMAGE"); ref != "" {
			built.ref = ref
			return
		}
		ctxDir, err := os.MkdirTemp("", "rtcedge-image-")
		if err != nil {
			built.err = err
			return
		}
		defer os.RemoveAll(ctxDir)
		ref := fmt.Sprintf("localhost/rtcedge:imagetest-%d", os.Getpid())
		start := time.Now()
		cmd := exec.Command("../../scripts/build-image.sh")
		cmd.Env = append(os.Environ(), "ENGINE=podman", "IMAGE="+ref, "VERSION=v0.0.0-imagetest", "CONTEXT_DIR="+ctxDir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("scripts/build-image.sh: %w\n%s", err, out)
			return
		}
		built.ref, built.owned = ref, true
		t.Logf("built %s in %v", ref, time.Since(start).Round(time.Millisecond))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.ref
}

// TestImageMetadata checks what Kubernetes and registries read from the
// image: a numeric non-root user, the entrypoint, and the OCI version and
// source labels.
func TestImageMetadata(t *testing.T) {
	ref := image(t)
	out, err := exec.Command("podman", "image", "inspect", ref).Output()
	if err != nil {
		t.Fatalf("podman image inspect %s: %v", ref, err)
	}
	var info []struct {
		Config struct {
			User       string
			Entrypoint []string
			Labels     map[string]string
		}
		Annotations map[string]string
	}
	if err := json.Unmarshal(out, &info); err != nil || len(info) != 1 {
		t.Fatalf("decode inspect output: %v (%d images)", err, len(info))
	}
	c := info[0].Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want the numeric non-root 65532:65532", c.User)
	}
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/usr/local/bin/rtcedge" {
		t.Errorf("entrypoint %q", c.Entrypoint)
	}
	for _, k := range []string{"org.opencontainers.image.version", "org.opencontainers.image.source", "org.opencontainers.image.revision", "org.opencontainers.image.created"} {
		if c.Labels[k] == "" || c.Labels[k] == "unknown" {
			t.Errorf("label %s = %q", k, c.Labels[k])
		}
	}
	if built.owned {
		if v := c.Labels["org.opencontainers.image.version"]; v != "v0.0.0-imagetest" {
			t.Errorf("version label %q, want the VERSION the build was given", v)
		}
		if v := info[0].Annotations["org.opencontainers.image.version"]; v != "v0.0.0-imagetest" {
			t.Errorf("version annotation %q", v)
		}
	}
}

// world is one test's containers and their shared config directory.
type world struct {
	t     *testing.T
	image string
	dir   string   // mounted read-only at /etc/rtcedge
	env   []string // secrets, passed by name so they stay off command lines
	ulim  []string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, image: image(t), ulim: ulimits(t)}
	// t.TempDir is 0700 and owned by the test's user; the containers run
	// as 65532 and must read the configs.
	w.dir = t.TempDir()
	if err := os.Chmod(w.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	random := func(n int) string {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return base64.StdEncoding.EncodeToString(b)
	}
	apiKey, apiSecret := "sk-imagetest-"+random(12), "imagetest-"+random(24)
	apiSecretSum := sha256.Sum256([]byte(apiSecret))
	// Every ${VAR} the example configs name, as a deployment sets them.
	w.env = []string{
		"RTCEDGE_TOKEN_KEYS=1:" + random(32),
		"RTCEDGE_HOP_KEYS=1/1:" + random(16), // the examples' cluster 1
		"RTCEDGE_GLOBAL_GOSSIP_KEY=" + random(32),
		"RTCEDGE_CLUSTER_GOSSIP_KEY=" + random(32),
		"RTCEDGE_APP_API_KEY=" + apiKey,
		"RTCEDGE_SESSION_API_SECRET=" + apiSecret,
		"RTCEDGE_SESSION_API_SECRET_1=" + apiSecret,
		"RTCEDGE_SESSION_API_SECRET_SHA256=" + hex.EncodeToString(apiSecretSum[:]),
		"RTCEDGE_CLIENT_SECRET_KEY=" + random(32),
		"RTCEDGE_SIGNALING_AUTHORITY_KEYS=signaling/1:" + random(32),
	}
	return w
}

func (w *world) secret(name string) string {
	for _, kv := range w.env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// ulimits returns the --ulimit flags: podman's defaults can exceed what an
// unprivileged or nested host allows, so they are set explicitly, below the
// host's hard limits.
func ulimits(t *testing.T) []string {
	t.Helper()
	limit := func(res int, want uint64) uint64 {
		var rl syscall.Rlimit
		if err := syscall.Getrlimit(res, &rl); err != nil {
			t.Fatalf("getrlimit: %v", err)
		}
		if rl.Max < want {
			return rl.Max
		}
		return want
	}
	const rlimitNproc = 6 // RLIMIT_NPROC on Linux
	nofile := limit(syscall.RLIMIT_NOFILE, 8192)
	nproc := limit(rlimitNproc, 4096)
	return []string{
		"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile, nofile),
		"--ulimit", fmt.Sprintf("nproc=%d:%d", nproc, nproc),
	}
}

// exampleConfig reads deploy/examples/<role>.yaml and applies set: dotted
// keys ("gossip.bind") to new values, nil to delete. A key that is not in
// the example fails the test unless it is listed in add, so a change to the
// examples' keys shows up here rather than as a silently ignored override.
func (w *world) exampleConfig(role string, set map[string]any, add ...string) string {
	w.t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "examples", role+".yaml"))
	if err != nil {
		w.t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		w.t.Fatalf("examples/%s.yaml: %v", role, err)
	}
	for key, v := range set {
		parts := strings.Split(key, ".")
		m := cfg
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				w.t.Fatalf("examples/%s.yaml has no section %q (for %s)", role, p, key)
			}
			m = sub
		}
		last := parts[len(parts)-1]
		if _, ok := m[last]; !ok && !contains(add, key) {
			w.t.Fatalf("examples/%s.yaml has no key %s", role, key)
		}
		if v == nil {
			delete(m, last)
		} else {
			m[last] = v
		}
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	name := role + ".yaml"
	if err := os.WriteFile(filepath.Join(w.dir, name), out, 0o644); err != nil {
		w.t.Fatal(err)
	}
	return "/etc/rtcedge/" + name
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// container is one role running in a container; its log is the attached
// podman client's output.
type container struct {
	*proctest.Proc
	name string
}

// start runs the image as one role with the given config (a path inside
// the container), the way the Kubernetes modules run it: non-root (the
// image's user), read-only root file system, no capabilities.
func (w *world) start(role, config string) *container {
	w.t.Helper()
	return w.run(role, role, "-config", config)
}

// run runs the image with args under the container name suffix name.
func (w *world) run(name string, args ...string) *container {
	w.t.Helper()
	role := name
	name = fmt.Sprintf("rtcedge-imagetest-%d-%s", os.Getpid(), name)
	cmd := args
	args = []string{
		"--runtime", "runc", "--cgroup-manager", "cgroupfs",
		"run", "--rm", "--name", name, "--label", fmt.Sprintf("%s=%d", runLabel, os.Getpid()),
		"--network", "host", "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges",
		"--volume", w.dir + ":/etc/rtcedge:ro",
	}
	args = append(args, w.ulim...)
	for _, kv := range w.env {
		k, _, _ := strings.Cut(kv, "=")
		args = append(args, "--env", k)
	}
	args = append(append(args, w.image), cmd...)
	c := &container{name: name, Proc: proctest.Start(w.t, "podman", proctest.Spec{Name: role, Args: args, Env: w.env})}
	// Runs before proctest's cleanup (LIFO): the container goes first, so
	// killing the podman client never leaves it running under conmon.
	w.t.Cleanup(func() {
		_ = exec.Command("podman", "rm", "--force", "--ignore", "--time", "0", name).Run()
	})
	return c
}

// term sends SIGTERM to the role inside the container.
func (c *container) term(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("podman", "kill", "--signal", "TERM", c.name).CombinedOutput(); err != nil {
		t.Fatalf("podman kill %s: %v: %s", c.name, err, out)
	}
}

// TestCallThroughContainers starts every role from the image with the
// example configs (addresses moved to loopback, ports chosen by the kernel:
// with host networking a container binds in the host's network namespace,
// and each role logs what it bound), places a real Pion call through
// global relay -> cluster relay -> transceiver -> echo and back, drains the
// transceiver with SIGTERM while the call runs, then stops every container
// with SIGTERM: each must exit 0 within its drain bound.
func TestCallThroughContainers(t *testing.T) {
	w := newWorld(t)
	gossip := func(prefix, name string, join ...string) map[string]any {
		m := map[string]any{prefix + ".bind": "127.0.0.1:0", prefix + ".name": name, prefix + ".fast": true}
		if len(join) > 0 {
			m[prefix+".join"] = join
		} else {
			m[prefix+".join"] = nil
		}
		return m
	}
	merge := func(ms ...map[string]any) map[string]any {
		out := map[string]any{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	const up = 60 * time.Second // a first container start on a loaded box

	tr := w.start("transceiver", w.exampleConfig("transceiver", merge(map[string]any{
		"metrics_addr": "127.0.0.1:0", "pod": 1, "drain_timeout": "30s",
		"data_addr": "127.0.0.1:0", "data_advertise": nil, "api_addr": "127.0.0.1:0", "api_advertise": nil,
		"gossip.advertise": nil,
	}, gossip("gossip", "pod-1")), "gossip.name", "gossip.fast"))
	trUp := tr.WaitLog(t, "transceiver up", up)

	cr := w.start("clusterrelay", w.exampleConfig("clusterrelay", merge(map[string]any{
		"metrics_addr": "127.0.0.1:0",
		"data_addr":    "127.0.0.1:0", "data_advertise": nil, "api_addr": "127.0.0.1:0", "api_advertise": nil,
	}, gossip("cluster_gossip", "cr-1", trUp["gossip"]), gossip("global_gossip", "cr-1")),
		"cluster_gossip.name", "cluster_gossip.fast", "global_gossip.name", "global_gossip.fast"))
	crUp := cr.WaitLog(t, "cluster relay up", up)

	gr := w.start("globalrelay", w.exampleConfig("globalrelay", merge(map[string]any{
		"metrics_addr": "127.0.0.1:0", "public_addr": "127.0.0.5:0", "internal_addr": "127.0.0.1",
		"workers": 2, "flow_idle": "2s", "drain_timeout": "20s",
	}, gossip("gossip", "gr-1", crUp["global_gossip"])), "gossip.name", "gossip.fast"))
	grUp := gr.WaitLog(t, "global relay up", up)

	catalogue := fmt.Sprintf("default_region: eu-central\nregions:\n  - name: eu-central\n    location: {lat: 50.11, lon: 8.68}\n"+
		"    clusters:\n      - {id: 1, name: eu-central-1, session_api: %q}\n"+
		"    pops:\n      - {id: 1, name: fra, vip: %q}\n", crUp["api"], grUp["public"])
	if err := os.WriteFile(filepath.Join(w.dir, "catalogue.yaml"), []byte(catalogue), 0o644); err != nil {
		t.Fatal(err)
	}
	sig := w.start("signaling", w.exampleConfig("signaling", merge(map[string]any{
		"metrics_addr": "127.0.0.1:0", "listen_addr": "127.0.0.1:0", "geoip_db": "", "drain_delay": "1s",
	}, gossip("gossip", "sig-1", crUp["global_gossip"])), "gossip.name", "gossip.fast"))
	url := sig.WaitLog(t, "signaling up", up)["url"]

	waitFor(t, 30*time.Second, "signaling to see cluster 1 healthy through gossip", func() bool { return clusterHealthy(url) })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dial := func() (*probe.Call, error) {
		return probe.Dial(ctx, probe.Config{
			SignalingURL: url, Token: w.secret("RTCEDGE_APP_API_KEY"), Logger: quiet,
			IPFilter: func(ip net.IP) bool { return ip.IsLoopback() },
		})
	}
	call, err := dial()
	if err != nil {
		t.Fatalf("call through the containers: %v", err)
	}
	defer call.Close()
	if err := call.WaitEcho(ctx); err != nil {
		t.Fatalf("no echo through global relay -> cluster relay -> transceiver: %v", err)
	}
	t.Logf("call through four containers: %+v", call.Timings())

	// SIGTERM the transceiver: no new sessions, the live call goes on,
	// and the container exits 0 once the call hangs up.
	tr.term(t)
	tr.WaitLog(t, "draining", 10*time.Second)
	waitFor(t, 20*time.Second, "signaling to refuse new calls", func() bool {
		c, err := dial()
		if err == nil {
			c.Close() // placed before the drain reached signaling
			return false
		}
		var he *probe.HTTPError
		return errors.As(err, &he) && he.Status == http.StatusServiceUnavailable
	})
	before := call.Stats().Received
	waitFor(t, 10*time.Second, "the draining pod's call to keep echoing", func() bool { return call.Stats().Received >= before+25 })
	if err := call.Hangup(ctx); err != nil {
		t.Fatalf("hang up: %v", err)
	}
	call.Close()
	tr.WaitLog(t, "drained", 20*time.Second)
	tr.Wait(t, 20*time.Second)

	// The rest drain in parallel; the global relay waits for its flow to
	// go idle (flow_idle), signaling for drain_delay.
	for _, c := range []*container{sig, gr, cr} {
		c.term(t)
	}
	for _, c := range []*container{sig, gr, cr} {
		c.Wait(t, 45*time.Second)
	}
}

// clusterHealthy reports whether signaling's /v1/regions shows its one
// cluster known and healthy.
func clusterHealthy(url string) bool {
	resp, err := http.Get(url + "/v1/regions")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		Regions []struct {
			Clusters []struct{ Known, Healthy bool } `json:"clusters"`
		} `json:"regions"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil || len(body.Regions) == 0 || len(body.Regions[0].Clusters) == 0 {
		return false
	}
	c := body.Regions[0].Clusters[0]
	return c.Known && c.Healthy
}

// waitFor polls cond until it holds or limit passes (the states awaited
// here live in other processes, with no event to subscribe to).
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
