package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/probe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// proc is a role process under test, with its log lines parsed.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []string
	seen chan struct{} // signalled on every new line
	done chan struct{}
	err  error
}

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rtcedge")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func startProc(t *testing.T, bin, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, seen: make(chan struct{}, 1), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.logs = append(p.logs, sc.Text())
			p.mu.Unlock()
			select {
			case p.seen <- struct{}{}:
			default:
			}
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			p.mu.Lock()
			t.Logf("--- %s log:\n%s", name, strings.Join(p.logs, "\n"))
			p.mu.Unlock()
		}
	})
	return p
}

// waitLog waits for a log line with msg="<msg>" and returns its key=value fields.
func (p *proc) waitLog(t *testing.T, msg string, limit time.Duration) map[string]string {
	t.Helper()
	deadline := time.After(limit)
	for {
		p.mu.Lock()
		for _, l := range p.logs {
			if f := logFields(l); f["msg"] == msg {
				p.mu.Unlock()
				return f
			}
		}
		p.mu.Unlock()
		select {
		case <-p.seen:
		case <-p.done:
			t.Fatalf("%s exited (%v) before logging %q", p.name, p.err, msg)
		case <-deadline:
			t.Fatalf("%s did not log %q within %v", p.name, msg, limit)
		}
	}
}

// logFields parses a slog text line (key=value, values quoted when they
// contain spaces).
func logFields(line string) map[string]string {
	out := map[string]string{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		k, rest, ok := strings.Cut(line, "=")
		if !ok {
			break
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				break
			}
			v, line = rest[1:end+1], rest[end+2:]
		} else {
			v, line, _ = strings.Cut(rest, " ")
		}
		out[k] = v
	}
	return out
}

func (p *proc) stop(t *testing.T, limit time.Duration) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", p.name, p.err)
		}
	case <-time.After(limit):
		t.Errorf("%s did not exit within %v of SIGTERM", p.name, limit)
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRolesAsProcesses runs every role as its own process, configured the
// way an operator would (YAML files, secrets in the environment), places a
// real call through them, and drains the transceiver with SIGTERM.
func TestRolesAsProcesses(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	env := []string{"RTCEDGE_TOKEN_KEYS=1:" + base64.StdEncoding.EncodeToString(key)}
	gossip := func(join string) string {
		s := "  bind: 127.0.0.1:0\n  insecure: true\n  fast: true\n"
		if join != "" {
			s += "  join: [" + join + "]\n"
		}
		return s
	}

	tr := startProc(t, bin, "transceiver", env, "transceiver", "-config", writeFile(t, dir, "transceiver.yaml",
		"region: eu-central\ncluster: 1\npod: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\ndrain_timeout: 20s\n"+
			"gossip:\n  name: pod-1\n"+gossip("")))
	trUp := tr.waitLog(t, "transceiver up", 10*time.Second)

	cr := startProc(t, bin, "clusterrelay", env, "clusterrelay", "-config", writeFile(t, dir, "clusterrelay.yaml",
		"region: eu-central\ncluster: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\n"+
			"cluster_gossip:\n  name: cr-1\n"+gossip(trUp["gossip"])+"global_gossip:\n  name: cr-1\n"+gossip("")))
	crUp := cr.waitLog(t, "cluster relay up", 10*time.Second)

	gr := startProc(t, bin, "globalrelay", env, "globalrelay", "-config", writeFile(t, dir, "globalrelay.yaml",
		"region: eu-central\npop: 1\npublic_addr: 127.0.0.5:0\ninternal_addr: 127.0.0.1\nworkers: 2\ndrain_timeout: 2s\n"+
			"gossip:\n  name: gr-1\n"+gossip(crUp["global_gossip"])))
	grUp := gr.waitLog(t, "global relay up", 10*time.Second)

	catalogue := writeFile(t, dir, "catalogue.yaml", fmt.Sprintf(
		"default_region: eu-central\nregions:\n  - name: eu-central\n    location: {lat: 50.11, lon: 8.68}\n"+
			"    clusters:\n      - {id: 1, name: eu-central-1, session_api: %q}\n"+
			"    pops:\n      - {id: 1, name: fra, vip: %q}\n", crUp["api"], grUp["public"]))
	sig := startProc(t, bin, "signaling", env, "signaling", "-config", writeFile(t, dir, "signaling.yaml",
		"listen_addr: 127.0.0.1:0\ncatalogue: "+catalogue+"\ndemo_page: true\n"+
			"gossip:\n  name: sig-1\n"+gossip(crUp["global_gossip"])))
	url := sig.waitLog(t, "signaling up", 10*time.Second)["url"]

	// Gossip has converged when signaling reports the cluster healthy and known.
	waitRegions(t, url, 10*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	call, err := probe.Dial(ctx, probe.Config{SignalingURL: url, Logger: quiet})
	if err != nil {
		t.Fatalf("dial through the role processes: %v", err)
	}
	defer call.Close()
	if err := call.WaitEcho(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("call through four processes: %+v", call.Timings())

	// SIGTERM the transceiver: it drains — no new sessions, the live call
	// goes on — and exits once the call hangs up.
	_ = tr.cmd.Process.Signal(syscall.SIGTERM)
	tr.waitLog(t, "draining", 5*time.Second)
	waitCondition(t, 10*time.Second, "signaling to refuse new calls", func() bool {
		c, err := probe.Dial(ctx, probe.Config{SignalingURL: url, Logger: quiet})
		if err == nil {
			c.Close() // placed before the drain reached signaling
			return false
		}
		var he *probe.HTTPError
		return errors.As(err, &he) && he.Status == http.StatusServiceUnavailable
	})
	before := call.Stats().Received
	waitCondition(t, 5*time.Second, "the draining pod's call to keep echoing", func() bool { return call.Stats().Received >= before+25 })
	if err := call.Hangup(ctx); err != nil {
		t.Fatalf("hang up: %v", err)
	}
	call.Close()
	tr.waitLog(t, "drained", 10*time.Second)
	select {
	case <-tr.done:
		if tr.err != nil {
			t.Errorf("transceiver exit: %v", tr.err)
		}
	case <-time.After(10 * time.Second):
		t.Error("transceiver did not exit after draining")
	}
	for _, p := range []*proc{sig, gr, cr} {
		p.stop(t, 15*time.Second)
	}
}

func waitRegions(t *testing.T, url string, limit time.Duration) {
	t.Helper()
	waitCondition(t, limit, "signaling to see cluster 1 healthy through gossip", func() bool {
		resp, err := http.Get(url + "/v1/regions")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Regions []struct {
				Clusters []struct {
					Known, Healthy bool
				} `json:"clusters"`
			} `json:"regions"`
		}
		if json.NewDecoder(resp.Body).Decode(&body) != nil || len(body.Regions) == 0 || len(body.Regions[0].Clusters) == 0 {
			return false
		}
		c := body.Regions[0].Clusters[0]
		return c.Known && c.Healthy
	})
}

func waitCondition(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
