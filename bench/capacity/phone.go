package capacity

// Phone calls (docs/sip.md, "Capacity"): how many PCMU calls one pod
// carries to the reference Realtime server, G.711 passed through or
// transcoded. The generator plays the carrier and both relay tiers at
// once: it creates each call through the pod's session API (kind rtp),
// learns the call's routing token from the pod-sealed route the pod
// writes to the route cache (a real redis-server, as a global relay reads
// it: docs/wire.md §6), and sends every call 50 RTP packets a second under
// the call's header from one UDP socket, reading the pod's replies on the
// same socket.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/udpio"
	"github.com/rtcedge/rtcedge/transceiver"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// PhoneConfig configures RunPhone.
type PhoneConfig struct {
	Bin, Dir string
	Steps    []int // call counts to hold, ascending
	// Passthrough sets the pod's backend_g711: the reference server gets
	// the calls' PCMU as it is; false: the pod transcodes.
	Passthrough    bool
	Settle, Window time.Duration // defaults 3s and 8s
	Progress       io.Writer
}

// PhoneStep is what one call count measured.
type PhoneStep struct {
	Calls         int     `json:"calls"`
	SetupFailures int     `json:"setup_failures"`
	PodCPU        float64 `json:"pod_cpu"`          // cores
	PerCall       float64 `json:"pod_cpu_per_call"` // per cent of a core
	// PerFullCall is PerCall over Heard: what a call whose every packet
	// the pod handled costs (a starved generator or pod sends or reads
	// fewer), the figure a projection divides the cores by.
	PerFullCall float64 `json:"pod_cpu_per_full_call"`
	RefCPU      float64 `json:"ref_cpu"`  // cores
	GenCPU      float64 `json:"gen_cpu"`  // cores
	BoxBusy     float64 `json:"box_busy"` // cores of the machine busy
	// Heard is the caller audio the pod handed its backend over the
	// window, in seconds per second per call (1: all of it; the pod's
	// call_packets_total{result="audio"}); ToBackend what reached the
	// server's socket (the connector's audio_seconds_total); Replied the
	// reply audio the pod paced out per call (rtcedge_reply_audio_seconds_total{state="sent"});
	// Received the reply packets the generator got over 50 a second per
	// call; Sent the packets it sent over 50 a second per call (1: it
	// kept up).
	Sent, Heard, ToBackend, Replied, Received float64
	Passthrough                               float64 `json:"passthrough_calls"` // the pod's calls_passthrough_total
	PodHeap                                   int64   `json:"pod_heap_bytes"`
	Load1                                     float64 `json:"load1"`
}

// phoneGen is the carriers of every call.
type phoneGen struct {
	conn  *net.UDPConn
	batch *udpio.BatchConn // sendLoop's sendmmsg and readLoop's recvmmsg
	pod   netip.AddrPort
	hop   *encap.Keyring
	api   string
	cache routecache.Cache

	mu    sync.Mutex
	calls []*phoneCall // guarded by mu

	received atomic.Int64 // reply RTP packets
	sent     atomic.Int64 // RTP packets sent
	audio    [][]byte     // 250 frames of G.711 (2 s of tone, 3 s of silence): the "turns" conversation
}

// phoneCall is one call's carrier side; owned by the sender after setup.
type phoneCall struct {
	media netip.AddrPort
	hdr   []byte // its encapsulation header
	seq   uint16
	ts    uint32
	frame int    // position in audio
	buf   []byte // its packet being sent
}

// RunPhone starts a redis-server, the reference server and a pod, and holds
// each step's call count for the window, measuring what each costs.
func RunPhone(ctx context.Context, cfg PhoneConfig) ([]PhoneStep, error) {
	if cfg.Settle == 0 {
		cfg.Settle = 3 * time.Second
	}
	if cfg.Window == 0 {
		cfg.Window = 8 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if len(cfg.Steps) == 0 {
		return nil, errors.New("capacity: no steps")
	}
	redisURL, stopRedis, err := startRedis(ctx, cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer stopRedis()
	ref, err := StartRefServer(ctx, cfg.Bin, Conversations["turns"], "", nil)
	if err != nil {
		return nil, err
	}
	defer ref.Stop()
	extra := fmt.Sprintf("backend_url: %s\nbackend_g711: %v\nredis_url: %s\nrtp_timeout: 30s\n", ref.URL, cfg.Passthrough, redisURL)
	pod, err := StartPod(ctx, cfg.Bin, cfg.Dir, cfg.Steps[len(cfg.Steps)-1]+100, PodOptions{Extra: extra})
	if err != nil {
		return nil, err
	}
	defer pod.Stop()
	g, err := newPhoneGen(ctx, pod, redisURL)
	if err != nil {
		return nil, err
	}
	defer g.close()
	sctx, stopSend := context.WithCancel(ctx)
	defer stopSend()
	go g.sendLoop(sctx)
	go g.readLoop()
	var steps []PhoneStep
	for _, n := range cfg.Steps {
		st, err := g.step(ctx, cfg, pod, ref, n)
		if err != nil {
			return steps, err
		}
		steps = append(steps, st)
		fmt.Fprintln(cfg.Progress, st.line())
		if err := pod.Died(); err != nil {
			return steps, err
		}
		if st.SetupFailures > max(2, n/20) {
			fmt.Fprintf(cfg.Progress, "%d setup failures: stopping\n", st.SetupFailures)
			break
		}
	}
	return steps, nil
}

// startRedis runs redis-server on a free loopback port without
// persistence, until stop.
func startRedis(ctx context.Context, dir string) (url string, stop func(), err error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return "", nil, errors.New("capacity: phone calls need redis-server (apt-get install redis-server)")
	}
	addr, err := freeLoopbackPort()
	if err != nil {
		return "", nil, err
	}
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return "redis://" + addr, stop, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("redis-server not up: %w", err)
		}
		time.Sleep(20 * time.Millisecond) // polling a port: no event to await
	}
}

func newPhoneGen(ctx context.Context, pod *Pod, redisURL string) (*phoneGen, error) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	_ = conn.SetReadBuffer(8 << 20)
	_ = conn.SetWriteBuffer(8 << 20)
	cache, err := routecache.Open(redisURL, routecache.Config{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	go func() { _ = cache.Run(ctx) }()
	g := &phoneGen{conn: conn, batch: udpio.NewBatchConn(conn, linkBatch), pod: pod.Data, hop: pod.HopKeys, api: pod.API, cache: cache}
	pcm := make([]int16, 160)
	for i := range 250 {
		for j := range pcm {
			pcm[j] = 0
			if i < 100 { // 2 s of 440 Hz, then 3 s of silence
				pcm[j] = int16(8000 * math.Sin(2*math.Pi*440*float64(i*160+j)/g711.ClockRate))
			}
		}
		g.audio = append(g.audio, g711.PCMU.Encode(nil, pcm))
	}
	return g, nil
}

func (g *phoneGen) close() {
	g.conn.Close()
	_ = g.cache.Close()
}

// step grows the calls to n, lets them settle and measures a window.
func (g *phoneGen) step(ctx context.Context, cfg PhoneConfig, pod *Pod, ref *RefServer, n int) (PhoneStep, error) {
	st := PhoneStep{Calls: n}
	st.SetupFailures = g.grow(ctx, n)
	if err := sleepCtx(ctx, cfg.Settle); err != nil {
		return st, err
	}
	a, err := takeSnapshot(ctx, pod, ref)
	if err != nil {
		return st, err
	}
	r0, s0 := g.received.Load(), g.sent.Load()
	if err := sleepCtx(ctx, cfg.Window); err != nil {
		return st, err
	}
	b, err := takeSnapshot(ctx, pod, ref)
	if err != nil {
		return st, err
	}
	secs := b.at.Sub(a.at).Seconds()
	calls := float64(g.size())
	cores := func(x, y time.Duration) float64 { return (y - x).Seconds() / secs }
	delta := func(name string) float64 { return b.metrics[name] - a.metrics[name] }
	st.PodCPU, st.RefCPU, st.GenCPU = cores(a.pod.CPU, b.pod.CPU), cores(a.ref.CPU, b.ref.CPU), cores(a.gen.CPU, b.gen.CPU)
	st.PerCall = 100 * st.PodCPU / calls
	st.BoxBusy = (b.box.Busy - a.box.Busy).Seconds() / secs
	st.Heard = delta(`rtcedge_transceiver_call_packets_total{result="audio"}`) / 50 / secs / calls
	if st.Heard > 0 {
		st.PerFullCall = st.PerCall / st.Heard
	}
	st.ToBackend = delta(`rtcedge_realtime_audio_seconds_total{direction="to_backend"}`) / secs / calls
	st.Replied = delta(`rtcedge_reply_audio_seconds_total{state="sent"}`) / secs / calls
	st.Received = float64(g.received.Load()-r0) / 50 / secs / calls
	st.Sent = float64(g.sent.Load()-s0) / 50 / secs / calls
	st.Passthrough = b.metrics["rtcedge_transceiver_calls_passthrough_total"]
	st.PodHeap = int64(b.metrics["go_memstats_heap_inuse_bytes"])
	st.Load1 = LoadAvg()
	return st, nil
}

func (st PhoneStep) line() string {
	return fmt.Sprintf("calls %d: pod %.2f cores (%.3f %% of a core per call, %.3f %% per call heard in full), ref server %.2f, generator %.2f, machine %.2f busy; sent %.3f, heard %.3f, to server %.3f, replied %.3f, received %.3f s/s per call; %d setup failures; load %.1f",
		st.Calls, st.PodCPU, st.PerCall, st.PerFullCall, st.RefCPU, st.GenCPU, st.BoxBusy, st.Sent, st.Heard, st.ToBackend, st.Replied, st.Received, st.SetupFailures, st.Load1)
}

func (g *phoneGen) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.calls)
}

// grow adds calls until there are n, eight set up at a time; it returns
// the failures.
func (g *phoneGen) grow(ctx context.Context, n int) int {
	next := g.size()
	var failed atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				c, err := g.newCall(ctx, i)
				if err != nil {
					failed.Add(1)
					continue
				}
				g.mu.Lock()
				g.calls = append(g.calls, c)
				g.mu.Unlock()
			}
		}()
	}
	for i := next; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	return int(failed.Load())
}

// newCall creates call i at the pod and learns its token from the route
// the pod wrote.
func (g *phoneGen) newCall(ctx context.Context, i int) (*phoneCall, error) {
	media := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 4000)
	offer := fmt.Sprintf("v=0\r\no=carrier 1 1 IN IP4 %s\r\ns=-\r\nc=IN IP4 %s\r\nt=0 0\r\nm=audio %d RTP/AVP 0\r\n"+
		"a=rtpmap:0 PCMU/8000\r\na=ptime:20\r\na=sendrecv\r\n", media.Addr(), media.Addr(), media.Port())
	vip := g.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	body, _ := json.Marshal(transceiver.APICreateRequest{Kind: sessionapi.KindRTP, Offer: offer,
		POPs: []transceiver.POPAddr{{ID: 1, VIP: vip}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(g.api, "/")+transceiver.SessionsPath, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("create call: %d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	tok, err := g.token(ctx, media)
	if err != nil {
		return nil, err
	}
	h := encap.Header{Cluster: 1, Pod: 1, POP: 1, Client: media, Ingress: vip, Token: tok}
	hdr, err := h.AppendTo(nil)
	if err != nil {
		return nil, err
	}
	return &phoneCall{media: media, hdr: hdr, seq: uint16(i), ts: uint32(i) * 7919, frame: i % len(g.audio)}, nil
}

// token reads the call's routing token from its route entry, as a global
// relay does (the pod writes it as the create returns).
func (g *phoneGen) token(ctx context.Context, media netip.AddrPort) ([6]byte, error) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		got := make(chan routecache.Route, 1)
		g.cache.Lookup(media, func(r routecache.Route) { got <- r })
		select {
		case r := <-got:
			if r.Pod != 0 {
				return r.Token, nil
			}
		case <-time.After(time.Second):
		}
		time.Sleep(50 * time.Millisecond) // the entry's write is queued: ask again
	}
	return [6]byte{}, fmt.Errorf("no route entry for %v", media)
}

// sendLoop sends every call one 20 ms packet per 20 ms until ctx ends,
// linkBatch packets per sendmmsg.
func (g *phoneGen) sendLoop(ctx context.Context) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	ms := make([]udpio.Msg, 0, linkBatch)
	flush := func() {
		for len(ms) > 0 {
			n, err := g.batch.WriteBatch(ms)
			g.sent.Add(int64(n))
			if err != nil {
				n++ // skip the one the kernel refused
			}
			ms = ms[:copy(ms, ms[min(n, len(ms)):])]
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		g.mu.Lock()
		calls := g.calls
		g.mu.Unlock()
		for _, c := range calls {
			ms = append(ms, udpio.Msg{Buf: c.packet(g), Addr: g.pod})
			if len(ms) == cap(ms) {
				flush()
			}
		}
		flush()
	}
}

// packet makes the call's next RTP packet under its header, sealed, in
// its own buffer (the sender's).
func (c *phoneCall) packet(g *phoneGen) []byte {
	c.seq++
	c.ts += 160
	c.frame = (c.frame + 1) % len(g.audio)
	buf := append(c.buf[:0], c.hdr...)
	hl := len(buf)
	a := c.media.Addr().As4()
	buf = append(buf, 0x80, 0, byte(c.seq>>8), byte(c.seq), byte(c.ts>>24), byte(c.ts>>16), byte(c.ts>>8), byte(c.ts), 0, 0, a[2], a[3])
	buf = append(buf, g.audio[c.frame]...)
	g.hop.Seal(buf, hl)
	c.buf = buf
	return buf
}

// readLoop counts the pod's reply packets until the socket closes.
func (g *phoneGen) readLoop() {
	ms := make([]udpio.Msg, linkBatch)
	for i := range ms {
		ms[i].Buf = make([]byte, 2048)
	}
	_ = g.batch.ReadLoop(ms, func(n int) bool {
		for _, m := range ms[:n] {
			if _, hl, err := encap.Decode(m.Buf[:m.N]); err == nil && m.N > hl+12 && m.Buf[hl]>>6 == 2 {
				g.received.Add(1)
			}
		}
		return true
	})
}
