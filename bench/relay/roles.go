package relay

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// RoleEnv names the environment variable that makes the harness binary (or
// a test binary, from TestMain) run one of the processes of a trial instead
// of the harness: see MaybeRunRole.
const RoleEnv = "RTCEDGE_RELAYBENCH_ROLE"

// keyEnv carries the token key (hex) to the children; the hop key (the
// inter-tier MAC key of the bench's cluster) is derived from it.
const keyEnv = "RTCEDGE_RELAYBENCH_KEY"

// grEnv carries a global relay variant's options to its child:
// "workers=N lock=1 cpus=0:1 steer=cpu", every part optional.
const grEnv = "RTCEDGE_RELAYBENCH_GR"

// bindEnv, when set, is the IPv4 address a child binds its sockets to
// instead of 127.0.0.1: its host's address in a -veth run.
const bindEnv = "RTCEDGE_RELAYBENCH_BIND"

// crEnv carries the cluster relay's options (bundle=1, loop=1; parsed as
// grEnv's) and echoEnv "bundle=1" to the echo, which then bundles its
// replies as a cluster relay would.
const (
	crEnv   = "RTCEDGE_RELAYBENCH_CR"
	echoEnv = "RTCEDGE_RELAYBENCH_ECHO"
)

// grOptions is a global relay variant: what the node config's workers,
// lock_threads, cpus and steering would say.
type grOptions struct {
	workers int // 0: one per CPU (GOMAXPROCS), the production default
	lock    bool
	cpus    []int
	steer   udpio.Steering
	bundle  bool
	loop    bool // event_loop (default true, as the node's)
	batch   int  // 0: udpio.DefaultBatch
	// fastPath is the relay's fast_path: off unless "fp=tc" (the node's
	// default, auto, would attach in a -veth run to paths meant to
	// measure user space).
	fastPath fastpath.Mode
}

func parseGROptions(s string) (grOptions, error) {
	o := grOptions{loop: true, fastPath: fastpath.ModeOff}
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "workers":
			o.workers, err = strconv.Atoi(v)
		case "lock":
			o.lock = v == "1"
		case "cpus":
			for _, c := range strings.Split(v, ":") {
				n, cerr := strconv.Atoi(c)
				if cerr != nil {
					err = cerr
				}
				o.cpus = append(o.cpus, n)
			}
		case "steer":
			o.steer, err = udpio.ParseSteering(v)
		case "bundle":
			o.bundle = v == "1"
		case "loop":
			o.loop = v != "0"
		case "batch":
			o.batch, err = strconv.Atoi(v)
		case "fp":
			o.fastPath, err = fastpath.ParseMode(v)

		default:
			err = fmt.Errorf("unknown option %q", k)
		}
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", grEnv, s, err)
		}
	}
	return o, nil
}

// Roles a child process can play. Each prints one JSON line (ready) on
// stdout when its sockets are open and runs until SIGTERM or until its
// stdin reaches EOF (the harness died).
const (
	roleEcho         = "echo"         // reflects datagrams; plays the cluster relay or the pod for encapsulated ones
	roleNaive        = "naive"        // plain read/write Go forwarder with the C forwarder's 8-byte header
	roleGlobalRelay  = "globalrelay"  // the globalrelay package with the role's production defaults
	roleClusterRelay = "clusterrelay" // the clusterrelay package with the role's production defaults
	roleGoEpoll      = "goepoll"      // runGoEpoll: a C-style event loop written in Go
	roleGoBlock      = "goblock"      // runGoEpoll, blocking: the C forwarder's threads written in Go
)

// ready is what a child reports once its sockets are open.
type ready struct {
	Addr    string   `json:"addr"`              // where the previous hop sends
	Ingress []string `json:"ingress,omitempty"` // global relay: its internal sockets
}

// MaybeRunRole runs a child role when RoleEnv is set and then exits the
// process; otherwise it returns at once. Call it first thing in main (and
// in TestMain of tests that run the harness).
func MaybeRunRole() {
	role := os.Getenv(RoleEnv)
	if role == "" {
		return
	}
	if err := runRole(role, os.Args[len(os.Args)-1]); err != nil {
		fmt.Fprintf(os.Stderr, "relaybench %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runRole runs one child until SIGTERM or stdin EOF. target is the next
// hop's address (unused by the echo).
func runRole(role, target string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the harness holds our stdin open; EOF means it is gone
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var to netip.AddrPort
	if role != roleEcho {
		var err error
		if to, err = netip.ParseAddrPort(target); err != nil {
			return fmt.Errorf("target %q: %w", target, err)
		}
	}
	loop := netip.MustParseAddrPort("127.0.0.1:0")
	if b := os.Getenv(bindEnv); b != "" {
		a, err := netip.ParseAddr(b)
		if err != nil {
			return fmt.Errorf("%s: %w", bindEnv, err)
		}
		loop = netip.AddrPortFrom(a, 0)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	key, err := hex.DecodeString(os.Getenv(keyEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", keyEnv, err)
	}
	hop, err := hopKeyring(key)
	if err != nil {
		return err
	}
	switch role {
	case roleEcho:
		c, err := udpio.Listen(loop)
		if err != nil {
			return err
		}
		announce(ready{Addr: udpio.LocalAddrPort(c).String()})
		go func() { <-ctx.Done(); c.Close() }()
		hooks := udpio.Hooks{Unbundle: encap.BundleFormat{}}
		if os.Getenv(echoEnv) == "bundle=1" {
			hooks.Bundle = encap.BundleFormat{}
		}
		return udpio.ForwardBatch(c, c, 0, encap.MaxDatagram, udpio.DefaultBatch, reflector(hop), hooks)
	case roleNaive:
		return runNaive(ctx, to)
	case roleGoEpoll:
		return runGoEpoll(ctx, to.Addr().As4(), int(to.Port()), false)
	case roleGoBlock:
		return runGoEpoll(ctx, to.Addr().As4(), int(to.Port()), true)
	case roleClusterRelay:
		c, err := udpio.Listen(loop)
		if err != nil {
			return err
		}
		opt, err := parseGROptions(os.Getenv(crEnv)) // bundle and loop apply
		if err != nil {
			c.Close()
			return err
		}
		r, err := clusterrelay.New(clusterrelay.Config{Cluster: benchCluster, Hop: hop, Pods: clusterrelay.NewPods(map[uint16]netip.AddrPort{benchPod: to}),
			Tuning: udpio.Tuning{Batch: udpio.DefaultBatch, Bundle: opt.bundle, EventLoop: &opt.loop}, FastPath: opt.fastPath, Logger: quiet}, c)
		if err != nil {
			c.Close()
			return err
		}
		announce(ready{Addr: r.Addr().String()})
		return r.Run(ctx)
	case roleGlobalRelay:
		keys, err := token.NewKeyring(1, map[uint8][]byte{1: key})
		if err != nil {
			return err
		}
		opt, err := parseGROptions(os.Getenv(grEnv))
		if err != nil {
			return err
		}
		// Production defaults of `rtcedge globalrelay` unless the variant
		// says otherwise: one worker per CPU (GOMAXPROCS: one when pinned
		// to one core), batches of 32, hash steering, threads unlocked.
		if opt.workers == 0 {
			opt.workers = udpio.Procs()
		}
		if opt.batch == 0 {
			opt.batch = udpio.DefaultBatch
		}
		pubs, ins, err := udpio.ListenWorkerPairs(loop, loop, opt.workers)
		if err != nil {
			return err
		}
		if err := udpio.Steer(pubs, opt.steer, opt.cpus); err != nil {
			return err
		}
		ws := make([]globalrelay.Worker, len(pubs))
		for i := range pubs {
			ws[i] = globalrelay.Worker{Public: pubs[i], Internal: ins[i]}
		}
		r, err := globalrelay.New(globalrelay.Config{POP: benchPOP, Keys: keys,
			Hop:       encap.NewClusterKeys(map[uint16]*encap.Keyring{benchCluster: hop}),
			Directory: globalrelay.NewClusters([]globalrelay.Replica{{Cluster: benchCluster, Addr: to}}),
			Tuning:    udpio.Tuning{Batch: opt.batch, LockThreads: opt.lock, CPUs: opt.cpus, Bundle: opt.bundle, EventLoop: &opt.loop},
			FastPath:  opt.fastPath, Logger: quiet}, ws)
		if err != nil {
			for i := range pubs {
				pubs[i].Close()
				ins[i].Close()
			}
			return err
		}
		rd := ready{Addr: r.PublicAddr().String()}
		for _, a := range r.IngressAddrs() {
			rd.Ingress = append(rd.Ingress, a.String())
		}
		announce(rd)
		return r.Run(ctx)
	}
	return fmt.Errorf("unknown role %q", role)
}

// The IDs every trial's flows carry.
const (
	benchCluster = 1
	benchPod     = 1
	benchPOP     = 1
)

func announce(r ready) {
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

// hopKeyring is the bench cluster's hop keyring, derived from the token
// key so that one secret reaches every child.
func hopKeyring(tokenKey []byte) (*encap.Keyring, error) {
	k := make([]byte, encap.KeyLen)
	for i := range k {
		k[i] = tokenKey[i%len(tokenKey)] ^ 0x5a
	}
	return encap.NewKeyring(1, map[uint8][]byte{1: k})
}

// reflector is the echo's decision: a datagram goes back to its sender;
// an encapsulated one toward the transceiver comes back toward the client,
// re-signed, which is what a pod (behind a cluster relay) or a cluster
// relay with its pod (behind a global relay alone) would send.
func reflector(hop *encap.Keyring) udpio.Decide {
	return func(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
		pkt := buf[:n]
		if toClient, ok := encap.PeekDirection(pkt); ok && !toClient {
			h, hl, err := encap.Decode(pkt)
			if err != nil || hop.Verify(pkt, hl) != nil {
				return nil, netip.AddrPort{}, false
			}
			h.ToClient = true
			if _, err := h.Put(pkt); err != nil {
				return nil, netip.AddrPort{}, false
			}
			hop.Seal(pkt, hl)
		}
		return pkt, from, true
	}
}

// hdrLen and hdrMagic are the C forwarder's header (fwd.c), which the
// naive Go forwarder uses too.
const (
	hdrLen   = 8
	hdrMagic = 0xC0
)

// runNaive is the naive Go forwarder: one goroutine per direction, one
// datagram per system call, the C forwarder's header and protocol.
func runNaive(ctx context.Context, target netip.AddrPort) error {
	loop := netip.MustParseAddrPort("127.0.0.1:0")
	if b := os.Getenv(bindEnv); b != "" {
		a, err := netip.ParseAddr(b)
		if err != nil {
			return fmt.Errorf("%s: %w", bindEnv, err)
		}
		loop = netip.AddrPortFrom(a, 0)
	}
	front, err := udpio.Listen(loop)
	if err != nil {
		return err
	}
	back, err := udpio.Listen(loop)
	if err != nil {
		front.Close()
		return err
	}
	announce(ready{Addr: udpio.LocalAddrPort(front).String()})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, hdrLen+encap.MaxDatagram)
		for {
			n, from, err := front.ReadFromUDPAddrPort(buf[hdrLen:])
			if err != nil {
				return
			}
			from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			buf[0], buf[1] = hdrMagic, 0
			buf[2], buf[3] = byte(from.Port()>>8), byte(from.Port())
			ip := from.Addr().As4()
			copy(buf[4:8], ip[:])
			_, _ = back.WriteToUDPAddrPort(buf[:hdrLen+n], target)
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, encap.MaxDatagram)
		for {
			n, _, err := back.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if n <= hdrLen || buf[0] != hdrMagic {
				continue
			}
			to := netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), uint16(buf[2])<<8|uint16(buf[3]))
			_, _ = front.WriteToUDPAddrPort(buf[hdrLen:n], to)
		}
	}()
	<-ctx.Done()
	front.Close()
	back.Close()
	wg.Wait()
	return nil
}

// child is one process of a trial.
type child struct {
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser // its stdin; closing it ends the child
	done chan struct{}
	err  error
	rd   ready
}

// pid returns the child's process ID.
func (c *child) pid() int { return c.cmd.Process.Pid }

var errNotReady = errors.New("child did not report ready")

// readReady reads the child's first stdout line: a ready JSON object from
// a Go role, "front <port> back <port>" from the C forwarder.
func readReady(r io.Reader) (ready, error) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return ready{}, errNotReady
	}
	line := sc.Text()
	var rd ready
	if len(line) > 0 && line[0] == '{' {
		err := json.Unmarshal([]byte(line), &rd)
		return rd, err
	}
	var front, back int
	if _, err := fmt.Sscanf(line, "front %d back %d", &front, &back); err != nil {
		return ready{}, fmt.Errorf("C forwarder said %q: %w", line, err)
	}
	rd.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(front))
	return rd, nil
}
