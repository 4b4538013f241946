// Running OpenTofu on the test's root module, and reading its plans.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// tofu runs one binary in one working directory; every run's output goes
// to log as well.
type tofu struct {
	bin, dir string
	env      []string
	log      io.Writer
}

// run runs tofu with args and returns its combined output; a non-zero exit
// is an error carrying the output's tail.
func (t *tofu) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, t.bin, append([]string{"-chdir=" + t.dir}, args...)...)
	cmd.Env = append(os.Environ(), t.env...)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, t.log)
	cmd.Stderr = cmd.Stdout
	fmt.Fprintf(t.log, "\n$ tofu %s\n", strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("tofu %s: %w\n%s", args[0], err, tail(out.String(), 40))
	}
	return out.String(), nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// resourceChange is one entry of a plan's resource_changes.
type resourceChange struct {
	Address string `json:"address"`
	Type    string `json:"type"`
	Change  struct {
		Actions []string `json:"actions"`
	} `json:"change"`
}

// plan is what a plan would do, by action: "create", "update", "replace"
// (delete and create), "delete".
type plan map[string][]string

// plan plans with vars (-var arguments) and reads the plan back as JSON.
func (t *tofu) plan(ctx context.Context, vars ...string) (plan, error) {
	args := append([]string{"plan", "-input=false", "-no-color", "-out=" + filepath.Join(t.dir, "test.tfplan")}, vars...)
	if _, err := t.run(ctx, args...); err != nil {
		return nil, err
	}
	out, err := t.show(ctx)
	if err != nil {
		return nil, err
	}
	var doc struct {
		ResourceChanges []resourceChange `json:"resource_changes"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return nil, fmt.Errorf("read plan: %w", err)
	}
	p := plan{}
	for _, rc := range doc.ResourceChanges {
		a := rc.Change.Actions
		switch {
		case slices.Equal(a, []string{"no-op"}), slices.Equal(a, []string{"read"}):
		case len(a) == 2:
			p["replace"] = append(p["replace"], rc.Address)
		case len(a) == 1:
			p[a[0]] = append(p[a[0]], rc.Address)
		default:
			return nil, fmt.Errorf("read plan: %s: actions %v", rc.Address, a)
		}
	}
	return p, nil
}

// show prints the saved plan as JSON (not to the log: it holds the
// Secrets' values).
func (t *tofu) show(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, t.bin, "-chdir="+t.dir, "show", "-json", "test.tfplan")
	cmd.Env = append(os.Environ(), t.env...)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("tofu show: %w", err)
	}
	return string(out), nil
}

// apply applies the saved plan.
func (t *tofu) apply(ctx context.Context) error {
	_, err := t.run(ctx, "apply", "-input=false", "-no-color", "test.tfplan")
	return err
}

// stateCount is the number of kubernetes_* resources in the state.
func (t *tofu) stateCount(ctx context.Context) (int, error) {
	out, err := t.run(ctx, "state", "list")
	if err != nil {
		if strings.Contains(out, "No state file") {
			return 0, nil
		}
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "kubernetes_") {
			n++
		}
	}
	return n, nil
}
