package testredis

import (
	"bufio"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ping sends a RESP PING and reports the reply line, or an error when the
// server cannot be reached or does not answer within d.
func ping(addr string, d time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestLifecycle(t *testing.T) {
	s := Start(t)
	if !strings.HasPrefix(s.URL(), "redis://127.0.0.1:") {
		t.Fatalf("URL() = %q", s.URL())
	}
	steps := []struct {
		name   string
		action func()
		want   string // "" means: no answer expected
	}{
		{"started", func() {}, "+PONG"},
		{"paused", s.Pause, ""},
		{"resumed", s.Resume, "+PONG"},
		{"killed", s.Kill, ""},
		{"killed twice", s.Kill, ""},
		{"restarted", s.Restart, "+PONG"},
	}
	addr := s.Addr()
	for _, st := range steps {
		st.action()
		if s.Addr() != addr {
			t.Fatalf("%s: address changed from %s to %s", st.name, addr, s.Addr())
		}
		got, err := ping(addr, 200*time.Millisecond)
		switch {
		case st.want != "" && (err != nil || got != st.want):
			t.Fatalf("%s: PING = %q, %v; want %q", st.name, got, err, st.want)
		case st.want == "" && err == nil:
			t.Fatalf("%s: PING answered %q; want no answer", st.name, got)
		case st.want == "" && !errors.Is(err, os.ErrDeadlineExceeded) && !isRefused(err):
			t.Fatalf("%s: PING error %v; want a timeout or a refused connection", st.name, err)
		}
	}
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
