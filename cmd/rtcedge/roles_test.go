package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/probe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(proctest.Main(m)) }

// startRole starts the binary as one role with its config file.
func startRole(t *testing.T, bin, role, config string, env []string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, bin, proctest.Spec{Name: role, Args: []string{role, "-config", config}, Env: env})
}

// TestRolesAsProcesses runs every role as its own process, configured the
// way an operator would (YAML files, secrets in the environment), places a
// real call through them, and drains the transceiver with SIGTERM.
func TestRolesAsProcesses(t *testing.T) {
	bin := proctest.Build(t, ".")
	dir := t.TempDir()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	hop := make([]byte, 16)
	_, _ = rand.Read(hop)
	env := []string{"RTCEDGE_TOKEN_KEYS=1:" + base64.StdEncoding.EncodeToString(key),
		"RTCEDGE_HOP_KEYS=1/1:" + base64.StdEncoding.EncodeToString(hop)}
	gossip := func(join string) string {
		s := "  bind: 127.0.0.1:0\n  insecure: true\n  fast: true\n"
		if join != "" {
			s += "  join: [" + join + "]\n"
		}
		return s
	}

	tr := startRole(t, bin, "transceiver", proctest.WriteFile(t, dir, "transceiver.yaml",
		"region: eu-central\ncluster: 1\npod: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\ndrain_timeout: 20s\n"+
			"gossip:\n  name: pod-1\n"+gossip("")), env)
	trUp := tr.WaitLog(t, "transceiver up", 10*time.Second)

	cr := startRole(t, bin, "clusterrelay", proctest.WriteFile(t, dir, "clusterrelay.yaml",
		"region: eu-central\ncluster: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\n"+
			"cluster_gossip:\n  name: cr-1\n"+gossip(trUp["gossip"])+"global_gossip:\n  name: cr-1\n"+gossip("")), env)
	crUp := cr.WaitLog(t, "cluster relay up", 10*time.Second)

	gr := startRole(t, bin, "globalrelay", proctest.WriteFile(t, dir, "globalrelay.yaml",
		"region: eu-central\npop: 1\nclusters: [1]\npublic_addr: 127.0.0.5:0\ninternal_addr: 127.0.0.1\nworkers: 2\ndrain_timeout: 2s\n"+
			"gossip:\n  name: gr-1\n"+gossip(crUp["global_gossip"])), env)
	grUp := gr.WaitLog(t, "global relay up", 10*time.Second)

	catalogue := proctest.WriteFile(t, dir, "catalogue.yaml", fmt.Sprintf(
		"default_region: eu-central\nregions:\n  - name: eu-central\n    location: {lat: 50.11, lon: 8.68}\n"+
			"    clusters:\n      - {id: 1, name: eu-central-1, session_api: %q}\n"+
			"    pops:\n      - {id: 1, name: fra, vip: %q}\n", crUp["api"], grUp["public"]))
	sig := startRole(t, bin, "signaling", proctest.WriteFile(t, dir, "signaling.yaml",
		"listen_addr: 127.0.0.1:0\ndrain_delay: 200ms\ncatalogue: "+catalogue+"\ndemo_page: true\nallow_anonymous: true\n"+
			"gossip:\n  name: sig-1\n"+gossip(crUp["global_gossip"])), env)
	url := sig.WaitLog(t, "signaling up", 10*time.Second)["url"]

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
	if err := tr.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	tr.WaitLog(t, "draining", 5*time.Second)
	proctest.Await(t, 10*time.Second, "signaling to refuse new calls", func() bool {
		c, err := probe.Dial(ctx, probe.Config{SignalingURL: url, Logger: quiet})
		if err == nil {
			c.Close() // placed before the drain reached signaling
			return false
		}
		var he *probe.HTTPError
		return errors.As(err, &he) && he.Status == http.StatusServiceUnavailable
	})
	before := call.Stats().Received
	proctest.Await(t, 5*time.Second, "the draining pod's call to keep echoing", func() bool { return call.Stats().Received >= before+25 })
	if err := call.Hangup(ctx); err != nil {
		t.Fatalf("hang up: %v", err)
	}
	call.Close()
	tr.WaitLog(t, "drained", 10*time.Second)
	tr.Wait(t, 10*time.Second)
	proctest.StopAll(t, 15*time.Second, sig, gr, cr)
}

func waitRegions(t *testing.T, url string, limit time.Duration) {
	t.Helper()
	proctest.Await(t, limit, "signaling to see cluster 1 healthy through gossip", func() bool {
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
