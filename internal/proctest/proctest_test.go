package proctest

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(Main(m)) }

func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Fields
	}{
		{`time=2026-01-02T03:04:05Z level=INFO msg="global relay up" pop=1 public=127.0.0.5:3478`,
			Fields{"time": "2026-01-02T03:04:05Z", "level": "INFO", "msg": "global relay up", "pop": "1", "public": "127.0.0.5:3478"}},
		{`level=WARN msg=x err="dial: \"a b\" refused" empty= last=1`,
			Fields{"level": "WARN", "msg": "x", "err": `dial: "a b" refused`, "empty": "", "last": "1"}},
		{`"odd key"=v`, Fields{"odd key": "v"}},
		{`panic: runtime error`, Fields{}},
		{`msg=ok trailing garbage`, Fields{"msg": "ok"}},
		{`msg="unterminated`, Fields{}},
		{``, Fields{}},
	} {
		got := ParseLine(tc.line)
		if len(got) != len(tc.want) {
			t.Errorf("ParseLine(%q) = %v, want %v", tc.line, got, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("ParseLine(%q)[%q] = %q, want %q", tc.line, k, got[k], v)
			}
		}
	}
}

// TestProcess builds the child once (the second Build is served from the
// cache), starts it with an environment, waits for its log lines, and stops
// it with SIGTERM.
func TestProcess(t *testing.T) {
	bin := Build(t, "./testdata/child")
	if again := Build(t, "./testdata/child"); again != bin {
		t.Errorf("second Build gave %s, want the cached %s", again, bin)
	}
	p := Start(t, bin, Spec{Name: "child", Env: []string{"PROCTEST_CHILD=yes"}})
	up := p.WaitLog(t, "child up", 10*time.Second)
	if up["addr"] != "127.0.0.1:0" || up["note"] != `a "quoted" value` || up["env"] != "yes" {
		t.Errorf("fields %v", up)
	}
	if _, ok := p.Find(func(f Fields) bool { return f["msg"] == "stopping" }); ok {
		t.Error("found a line the child has not logged yet")
	}
	p.Stop(t, 10*time.Second)
	if p.Count("stopping") != 1 {
		t.Errorf("log %q: want one stopping line", p.Lines())
	}
	if p.Err() != nil {
		t.Errorf("exit: %v", p.Err())
	}
}

// TestProcessExit sees an early exit and its status; the last line logged
// before the exit is still found.
func TestProcessExit(t *testing.T) {
	p := Start(t, Build(t, "./testdata/child"), Spec{Args: []string{"-exit", "3"}})
	<-p.Done()
	if f := p.WaitLog(t, "exiting early", time.Second); f["status"] != "3" {
		t.Errorf("fields %v", f)
	}
	if p.Err() == nil {
		t.Error("exit status 3 reported as success")
	}
}
