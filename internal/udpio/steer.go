package udpio

import "fmt"

// Steering is how the kernel spreads a SO_REUSEPORT group's datagrams
// over its sockets (its workers).
type Steering int

const (
	// SteerHash is the kernel's default: a hash of the 4-tuple, so every
	// datagram of a flow reaches the same socket as long as the group's
	// sockets do not change.
	SteerHash Steering = iota
	// SteerCPU attaches a classic BPF program that picks socket i for
	// datagrams the kernel processes on CPU i (mod the group size), so a
	// worker pinned to CPU i reads what arrived on its own CPU: no
	// cross-CPU wake-up per datagram. A flow stays on one worker when its
	// packets stay on one CPU (NIC receive-side scaling hashes flows to
	// queues and so to CPUs).
	SteerCPU
	// SteerIncomingCPU sets SO_INCOMING_CPU = i on socket i: the kernel's
	// socket lookup then prefers, among equal candidates, the socket whose
	// CPU matches the one processing the datagram.
	SteerIncomingCPU
)

// String names the steering as configs spell it.
func (s Steering) String() string {
	switch s {
	case SteerHash:
		return "hash"
	case SteerCPU:
		return "cpu"
	case SteerIncomingCPU:
		return "incoming_cpu"
	}
	return fmt.Sprintf("steering(%d)", int(s))
}

// ParseSteering is the inverse of String; "" is SteerHash.
func ParseSteering(s string) (Steering, error) {
	switch s {
	case "", "hash":
		return SteerHash, nil
	case "cpu":
		return SteerCPU, nil
	case "incoming_cpu":
		return SteerIncomingCPU, nil
	}
	return 0, fmt.Errorf("steering %q: want hash, cpu or incoming_cpu", s)
}
