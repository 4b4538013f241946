package clusterrelay

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/steer"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
)

// TestSteerReportsOnlyForTheirPodsCalls: the front gives each create a
// ticket for the pod it goes to, that caller's key and those POPs; the
// forwarder passes a report on, stamped with its pod, only from an
// admitted pod under its own key and for its own calls. A compromised pod
// of the cluster (pod 8, holding its own issued keys) can report neither
// for a network that was never placed on it, nor through a POP its call
// was not offered, nor with pod 7's ticket, nor as pod 7; a pod gossip
// has not admitted is refused even with valid keys.
func TestSteerReportsOnlyForTheirPodsCalls(t *testing.T) {
	sec := testAuthority(t, 3)
	auth, err := sec.SteerAuthority(3)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }

	// The front places a create with a steering key on pod 7.
	tickets := make(chan string, 1)
	pod7 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tickets <- r.Header.Get(sessionapi.HeaderSteerTicket)
		id, _ := sessionid.New(3, 7)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"` + id.String() + `","answer":"v=0","cluster":3,"pod":7}`))
	}))
	defer pod7.Close()
	dir := NewDirectory()
	dir.SetPods([]PodInfo{{ID: 7, API: pod7.URL, Capacity: 10}, {ID: 8, Capacity: 10, Draining: true}})
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	front := httptest.NewServer(NewFront(FrontConfig{Cluster: 3, Pods: dir, HTTPClient: client, Logger: quiet, Steer: func() *steer.Authority { return auth }, Now: clock}).Handler())
	defer front.Close()
	k, err := steer.ParseKey("198.51.100.0/24@48,2")
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Post(front.URL+sessionapi.SessionsPath, "application/json",
		strings.NewReader(`{"offer":"v=0","pops":[{"id":1,"vip":"127.0.0.1:1"},{"id":2,"vip":"127.0.0.1:2"}],"steer":"`+k.String()+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	ticket, err := steer.ParseTicket(<-tickets)
	if err != nil {
		t.Fatalf("pod 7's create: %v", err)
	}

	reg := prometheus.NewRegistry()
	from := nodetest.Member(t, "cr", false, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 3}, "")
	to := nodetest.Member(t, "cr-global", true, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 3}, "")
	f, err := NewSteerForwarder(from, to, SteerForwarderConfig{Cluster: 3, Authority: func() *steer.Authority { return auth }, Now: clock,
		Admitted: func(pod uint16) bool { _, ok := dir.PodAddr(pod); return ok }}, reg)
	if err != nil {
		t.Fatal(err)
	}
	report := func(pod, signer uint16, c steer.Call) []byte {
		keys, err := sec.Pod(3, signer)
		if err != nil {
			t.Fatal(err)
		}
		id, key, err := keys.SteerReportKey()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := steer.AppendReport(nil, 3, pod, id, key, []steer.Call{c})
		return b
	}
	honest := steer.Call{Key: k, Ticket: ticket, POPs: []uint16{1, 2}, RTTs: []steer.RTT{{POP: 1, RTT: 20 * time.Millisecond}, {POP: 2, RTT: 160 * time.Millisecond}}}

	f.receive(report(7, 7, honest))
	select {
	case msg := <-f.queue:
		m, err := steer.ParseMessage(msg)
		if err != nil || m.Source != steer.SourcePod || m.From != steer.PodReporter(3, 7) || len(m.Samples) != 2 || m.Samples[1].RTT != 160*time.Millisecond {
			t.Fatalf("forwarded %+v %v, want pod 3/7's 2 samples", m, err)
		}
		// Signed with cluster 3's relay key, as signaling checks it.
		if d := sec.SteerVerifier().Verify(&m, now); d != steer.Accepted {
			t.Fatalf("forwarded message: %v under cluster 3's relay key", d)
		}
	default:
		t.Fatal("pod 7's report was not forwarded")
	}

	otherNet := honest
	otherNet.Key, _ = steer.ParseKey("203.0.113.0/24@40,-74")
	farPOP := honest
	farPOP.RTTs = []steer.RTT{{POP: 9, RTT: time.Millisecond}}
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"pod 7, a network never placed on it", report(7, 7, otherNet)},
		{"pod 7, through a POP its call was not offered", report(7, 7, farPOP)},
		{"pod 8 with pod 7's ticket", report(8, 8, honest)},
		{"pod 8 as pod 7", report(7, 8, honest)},
		{"pod 9, not admitted, its own keys", report(9, 9, honest)},
	} {
		f.receive(tc.msg)
		if len(f.queue) != 0 {
			t.Errorf("%s: forwarded", tc.name)
			<-f.queue
		}
	}
	now = now.Add(steer.TicketMaxAge + time.Second)
	f.receive(report(7, 7, honest))
	if len(f.queue) != 0 {
		t.Error("a report with a ticket older than TicketMaxAge: forwarded")
	}
	f.receive([]byte("S garbage"))
	m := testmetrics.Take(t, reg)
	if r, i := m["rtcedge_clusterrelay_rtt_messages_total,result=refused"], m["rtcedge_clusterrelay_rtt_messages_total,result=invalid"]; r != 6 || i != 1 {
		t.Errorf("refused %v, invalid %v; want 6 and 1", r, i)
	}
}

// TestSteerForwarderSignsWithTheKeysInUse: the forwarder signs what it
// passes on with the relay key of the authority it is given per report,
// so a reload that makes a new cluster secret current (key ID 2) signs
// the next message under ID 2, which signaling holding only the old
// public key refuses and holding the new one believes.
func TestSteerForwarderSignsWithTheKeysInUse(t *testing.T) {
	old := testAuthority(t, 3)
	next, err := authority.Parse([]string{authority.Spec(3, 2, nodetest.Secret(t)), authority.Spec(3, 1, nodetest.Secret(t))})
	if err != nil {
		t.Fatal(err)
	}
	var inUse atomic.Pointer[steer.Authority]
	for _, sec := range []*authority.Secrets{old, next} {
		a, err := sec.SteerAuthority(3)
		if err != nil {
			t.Fatal(err)
		}
		inUse.Store(a)
		from := nodetest.Member(t, "cr", false, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 3}, "")
		to := nodetest.Member(t, "cr-global", true, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 3}, "")
		f, err := NewSteerForwarder(from, to, SteerForwarderConfig{Cluster: 3, Authority: inUse.Load}, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		// A report as the pod makes it, with its ticket for a new call.
		k, _ := steer.ParseKey("198.51.100.0/24@48,2")
		ticket, err := a.Mint(7, k, []uint16{1}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		keys, err := sec.Pod(3, 7)
		if err != nil {
			t.Fatal(err)
		}
		id, key, err := keys.SteerReportKey()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := steer.AppendReport(nil, 3, 7, id, key, []steer.Call{{Key: k, Ticket: ticket, POPs: []uint16{1}, RTTs: []steer.RTT{{POP: 1, RTT: 20 * time.Millisecond}}}})
		f.receive(b)
		if len(f.queue) != 1 {
			t.Fatal("the report was not forwarded")
		}
		m, err := steer.ParseMessage(<-f.queue)
		if err != nil {
			t.Fatal(err)
		}
		if want := sec.Current(3); m.Signer != (steer.SignerID{Role: steer.SignerRelay, Cluster: 3, KeyID: want}) {
			t.Fatalf("signed by %+v, want cluster 3's relay key ID %d", m.Signer, want)
		}
		if d := sec.SteerVerifier().Verify(&m, time.Now()); d != steer.Accepted {
			t.Fatalf("under the keys in use: %v", d)
		}
		if sec == next {
			if d := old.SteerVerifier().Verify(&m, time.Now()); d != steer.DropUnknown {
				t.Fatalf("under the old keys only: %v, want %v", d, steer.DropUnknown)
			}
		}
	}
}
