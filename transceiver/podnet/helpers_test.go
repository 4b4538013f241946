package podnet

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/internal/encap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var popA = POP{ID: 1, VIP: netip.MustParseAddrPort("127.0.0.2:3478")}

// fakeSession plays the session layer's side of one session: audio goes
// to a recorder, the selected path and credentials are what the test says.
type fakeSession struct {
	audio          interface{ Audio([]byte, time.Duration) }
	pop            uint16
	peer           netip.AddrPort
	tcp            bool
	server, client Creds
}

func (f *fakeSession) Audio(p []byte, d time.Duration) { f.audio.Audio(p, d) }
func (f *fakeSession) Path() (uint16, netip.AddrPort, bool) {
	return f.pop, f.peer, f.tcp
}
func (f *fakeSession) Creds() (server, client Creds) { return f.server, f.client }

// fakeSessions is the session layer's token index, as a test plays it.
type fakeSessions map[[6]byte]Session

func (f fakeSessions) ByToken(nonce [6]byte) Session { return f[nonce] }

// newMetrics makes the packet layer's metrics, registered with reg unless
// it is nil.
func newMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := NewMetrics()
	if reg != nil {
		for _, c := range m.Collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func newPodSocket(conn *net.UDPConn, cluster, pod uint16, keys *encap.Keyring, relays *RelaySet, m *Metrics, now func() time.Time) *Socket {
	return NewSocket(conn, Config{Cluster: cluster, Pod: pod, HopKeys: keys, Relays: relays, Metrics: m, Now: now})
}

// counter reads a counter of a registry by one label (any series when
// label is "").
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
			if label == "" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
