package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type sample struct {
	Addr  string `yaml:"addr"`
	Other string `yaml:"other"`
	Env   string `yaml:"-"`
}

func (s *sample) ApplyEnv() error {
	s.Env = "applied"
	return nil
}

func write(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	t.Setenv("RTCEDGE_TEST_POD_IP", "10.1.2.3")
	t.Setenv("RTCEDGE_TEST_EMPTY", "")
	for _, tc := range []struct {
		name, file string
		want       sample
		errHas     []string
	}{
		{name: "expands braced", file: "addr: \"${RTCEDGE_TEST_POD_IP}:7000\"\nother: \"$NOT_EXPANDED\"\n",
			want: sample{Addr: "10.1.2.3:7000", Other: "$NOT_EXPANDED", Env: "applied"}},
		{name: "set but empty is fine", file: "addr: \"${RTCEDGE_TEST_EMPTY}:1\"\n", want: sample{Addr: ":1", Env: "applied"}},
		{name: "unset variable named", file: "addr: x\nother: ${RTCEDGE_TEST_UNSET_B}${RTCEDGE_TEST_UNSET_A}${RTCEDGE_TEST_UNSET_B}\n",
			errHas: []string{"line 2", "RTCEDGE_TEST_UNSET_B, RTCEDGE_TEST_UNSET_A"}},
		{name: "comments and keys are not expanded", file: "# ${RTCEDGE_TEST_UNSET_A} in a comment\naddr: x # ${RTCEDGE_TEST_UNSET_B}\n",
			want: sample{Addr: "x", Env: "applied"}},
		{name: "expanded value keeps its type", file: "addr: \"${RTCEDGE_TEST_POD_IP}\"\n", want: sample{Addr: "10.1.2.3", Env: "applied"}},
		{name: "unknown key", file: "addr: x\nadr_typo: y\n", errHas: []string{"adr_typo"}},
		{name: "empty file", file: "", want: sample{Env: "applied"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got sample
			err := Load(write(t, tc.file), &got)
			if len(tc.errHas) > 0 {
				if err == nil {
					t.Fatalf("accepted: %+v", got)
				}
				for _, s := range tc.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not name %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestUnsetIsSentinel(t *testing.T) {
	_, err := Expand("${RTCEDGE_TEST_NEVER_SET}", func(string) (string, bool) { return "", false })
	if !errors.Is(err, ErrUnsetVariable) {
		t.Fatalf("err = %v, want ErrUnsetVariable", err)
	}
}

func TestMissingFile(t *testing.T) {
	if err := Load(filepath.Join(t.TempDir(), "none.yaml"), &sample{}); err == nil {
		t.Fatal("missing file accepted")
	}
}
