// Package sipfront is rtcedge's SIP front: it takes calls from carrier
// trunks over SIP (UDP and TCP), authenticates the trunk, limits it,
// places the call on a transceiver pod through the shared placement (as
// signaling does for WebRTC) and answers with the pod's SDP. Media never
// crosses the front: it goes through the POP's relays (docs/wire.md §6).
//
// The transaction layer and the transports are emiago/sipgo's; the front
// owns the handlers per method (handlers.go) and one dialog state machine
// (dialog.go). docs/sip.md says how a trunk is set up and what is built.
package sipfront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/placement"
)

// errClosed is Serve called after Close.
var errClosed = errors.New("sipfront: closed")

// Deps are what a Front is built on besides its Config: the shared
// placement and how to locate a carrier.
type Deps struct {
	Placer   *placement.Placer   // required
	Clusters *placement.Clusters // required: deletes the sessions of ended calls
	// Catalogue resolves trunk POP pins by name; required.
	Catalogue *geo.Catalogue
	// Locate says where a carrier's signaling address is; nil: the
	// catalogue's default location.
	Locate     func(netip.Addr) geo.Location
	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil: metrics are not registered
}

// Front is the SIP front. Build it with New, serve listeners with Serve,
// end it with Close.
type Front struct {
	// Static after New.
	cfg      Config
	deps     Deps
	log      *slog.Logger
	trunks   []*trunk
	pins     map[string][]geo.POP // trunk name → its pinned POP
	nonces   *nonces
	sources  *sourceLimits
	m        *metrics
	ua       *sipgo.UserAgent
	srv      *sipgo.Server
	client   *sipgo.Client
	dialogs  *dialogs
	sipLimit *logLimiter
	pending  *callIDs     // calls under call control, by call_id
	keys     []apiKey     // the call-control API's credentials
	peers    *http.Client // forwards decisions to the replica holding the call
	hooks    *http.Client // delivers webhooks

	// contacts are the DialogUAs answers are built with, by transport
	// ("UDP", "TCP"): their Contact names the listener of that transport.
	// Set by Serve; guarded by mu.
	mu       sync.Mutex
	contacts map[string]*sipgo.DialogUA
	closed   bool

	calls sync.WaitGroup // INVITE handlers in flight; Add only under mu while !closed
}

// New builds a Front from cfg (Defaults applied) and deps.
func New(cfg Config, deps Deps) (*Front, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sipfront config: %w", err)
	}
	if deps.Placer == nil || deps.Clusters == nil || deps.Catalogue == nil {
		return nil, errors.New("sipfront: a placer, the clusters and the catalogue are required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	f := &Front{cfg: cfg, deps: deps, log: deps.Logger.With("component", "sipfront"), pins: map[string][]geo.POP{},
		sources: newSourceLimits(cfg.SourceRate, cfg.SourceBurst, cfg.MaxSources), dialogs: newDialogs(cfg.MaxDialogs),
		pending: newCallIDs(), keys: newAPIKeys(cfg), peers: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	var err error
	if f.m, err = newMetrics(deps.Registerer); err != nil {
		return nil, err
	}
	if f.nonces, err = newNonces(); err != nil {
		return nil, err
	}
	f.hooks = newWebhookClient(cfg.WebhookTimeout, cfg.WebhookAllowPrivate)
	for _, tc := range cfg.Trunks {
		t, err := newTrunk(tc)
		if err != nil {
			return nil, fmt.Errorf("sipfront trunk %s: %w", tc.Name, err)
		}
		t.hook = cfg.webhookFor(tc, f.hooks)
		if tc.POP != "" {
			pop, ok := popByName(deps.Catalogue, tc.POP)
			if !ok {
				return nil, fmt.Errorf("sipfront trunk %s: no POP %q in the catalogue", tc.Name, tc.POP)
			}
			f.pins[tc.Name] = []geo.POP{pop}
		}
		f.trunks = append(f.trunks, t)
	}
	if err := f.newStack(); err != nil {
		return nil, err
	}
	return f, nil
}

// newStack builds sipgo's user agent, server and client with the front's
// read filter (the per-source limit) and logger (parse failures counted,
// the rest rate-limited).
func (f *Front) newStack() error {
	f.sipLimit = newLogLimiter(f.log.With("from", "sipgo"), f.m.dropped.WithLabelValues(resultMalformed))
	sipLog := slog.New(f.sipLimit)
	var err error
	f.ua, err = sipgo.NewUA(sipgo.WithUserAgent("rtcedge"),
		sipgo.WithUserAgentTransportLayerOptions(sip.WithTransportLayerLogger(sipLog), sip.WithTransportLayerReadFilter(f.readFilter)),
		sipgo.WithUserAgentTransactionLayerOptions(sip.WithTransactionLayerLogger(sipLog)))
	if err != nil {
		return fmt.Errorf("sipfront: user agent: %w", err)
	}
	if f.srv, err = sipgo.NewServer(f.ua, sipgo.WithServerLogger(sipLog)); err != nil {
		return fmt.Errorf("sipfront: server: %w", err)
	}
	if f.client, err = sipgo.NewClient(f.ua, sipgo.WithClientLogger(sipLog)); err != nil {
		return fmt.Errorf("sipfront: client: %w", err)
	}
	f.srv.OnInvite(f.handleInvite)
	f.srv.OnAck(f.handleAck)
	f.srv.OnBye(f.handleBye)
	f.srv.OnCancel(f.handleCancel)
	f.srv.OnOptions(f.handleOptions)
	f.srv.OnNotify(f.handleNotify)
	f.srv.OnNoRoute(f.handleOther)
	return nil
}

func popByName(cat *geo.Catalogue, name string) (geo.POP, bool) {
	for _, r := range cat.Regions {
		for _, p := range r.POPs {
			if p.Name == name {
				return p, true
			}
		}
	}
	return geo.POP{}, false
}

// readFilter drops, unanswered and counted, every datagram or TCP read
// of a source over its rate: no answer, no parse, no state.
func (f *Front) readFilter(p sip.TransportReadProps, data []byte) ([]byte, error) {
	if ap, ok := addrPortOf(p.RemoteAddr); ok && !f.sources.allow(ap.Addr(), f.cfg.Now()) {
		f.m.dropped.WithLabelValues(resultSourceLimit).Inc()
		return nil, nil
	}
	return data, nil
}

func addrPortOf(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort(), true
	case *net.TCPAddr:
		return a.AddrPort(), true
	}
	ap, err := netip.ParseAddrPort(a.String())
	return ap, err == nil
}

// Listeners are the sockets a Front serves; any may be nil, not all.
type Listeners struct {
	UDP net.PacketConn
	TCP net.Listener
	// TLS is a listener of TLS connections (tls.NewListener): SIP over
	// TLS, 5061 by convention.
	TLS net.Listener
}

// Serve serves SIP on l until ctx ends or Close is called; it takes
// ownership of the listeners. Each transport's listener address is the
// Contact of answers over it unless ContactHost is set.
func (f *Front) Serve(ctx context.Context, l Listeners) error {
	type serve struct {
		transport string
		local     net.Addr
		run       func() error
		close     func() error
	}
	var all []serve
	if l.UDP != nil {
		all = append(all, serve{"UDP", l.UDP.LocalAddr(), func() error { return f.srv.ServeUDP(l.UDP) }, l.UDP.Close})
	}
	if l.TCP != nil {
		all = append(all, serve{"TCP", l.TCP.Addr(), func() error { return f.srv.ServeTCP(l.TCP) }, l.TCP.Close})
	}
	if l.TLS != nil {
		all = append(all, serve{"TLS", l.TLS.Addr(), func() error { return f.srv.ServeTLS(l.TLS) }, l.TLS.Close})
	}
	if len(all) == 0 {
		return errors.New("sipfront: no listener")
	}
	for _, s := range all {
		if err := f.setContact(s.transport, s.local); err != nil {
			for _, s := range all {
				_ = s.close()
			}
			if errors.Is(err, errClosed) {
				return nil // closed before it served: nothing to serve
			}
			return err
		}
	}
	served := make(chan error, len(all))
	for _, s := range all {
		go func() { served <- ignoreClosed(s.run()) }()
	}
	n := len(all)
	var errs []error
	select {
	case <-ctx.Done():
	case err := <-served: // a listener failed, or Close stopped the stack
		errs = append(errs, err)
		n--
	}
	for _, s := range all {
		_ = s.close()
	}
	for ; n > 0; n-- {
		errs = append(errs, <-served)
	}
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if err == nil || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (f *Front) setContact(transport string, local net.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	ap, ok := addrPortOf(local)
	if !ok {
		return fmt.Errorf("sipfront: listener address %v", local)
	}
	host := f.cfg.ContactHost
	if host == "" {
		host = ap.Addr().Unmap().String()
	}
	uri := sip.Uri{Scheme: "sip", Host: host, Port: int(ap.Port())}
	if transport != "UDP" {
		uri.UriParams = sip.NewParams()
		uri.UriParams.Add("transport", strings.ToLower(transport))
	}
	if transport == "TLS" {
		uri.Scheme = "sips"
	}
	if f.contacts == nil {
		f.contacts = map[string]*sipgo.DialogUA{}
	}
	f.contacts[transport] = &sipgo.DialogUA{Client: f.client, ContactHDR: sip.ContactHeader{Address: uri}}
	return nil
}

// URI is the SIP URI carriers and softphones call (sip:agent@host:port),
// known once Serve has started.
func (f *Front) URI(local net.Addr) string {
	ap, _ := addrPortOf(local)
	host := f.cfg.ContactHost
	if host == "" {
		host = ap.Addr().Unmap().String()
		if ap.Addr().Unmap().Is6() {
			host = "[" + host + "]"
		}
	}
	return "sip:agent@" + host + ":" + strconv.Itoa(int(ap.Port()))
}

// dialogUA is the DialogUA answers to a request over transport are
// built with (nil before Serve, or for a transport not served).
func (f *Front) dialogUA(transport string) *sipgo.DialogUA {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.contacts[strings.ToUpper(transport)]
}

// Dialogs is the number of live calls.
func (f *Front) Dialogs() int { return f.dialogs.len() }

// Close ends every live call (BYE to the carrier, DELETE of the session)
// and stops the SIP stack. Idempotent; the listeners are Serve's to close.
func (f *Front) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	f.Drain(ctx)
	f.calls.Wait()
	f.hooks.CloseIdleConnections()
	f.peers.CloseIdleConnections()
	return f.ua.Close()
}

// Drain ends every live call: BYE to the carrier of an answered one, the
// session deleted at its cluster. New calls are still taken; a stopping
// node drains before it closes its sockets.
func (f *Front) Drain(ctx context.Context) {
	for _, d := range f.dialogs.all() {
		f.hangup(ctx, d)
	}
}
