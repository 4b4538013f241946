package fastpath

// The classic-BPF socket programs: which socket of a SO_REUSEPORT group
// takes a datagram. They are assembled here, beside the TC programs, so
// every kernel program of the project lives in one package; AttachReuseport
// (socket_linux.go) attaches them.

import (
	"golang.org/x/net/bpf"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// CPUSteering returns a classic BPF program mapping the processing CPU to
// the index of the socket whose worker runs on it (cpuOf(i) is socket i's
// CPU); CPUs with no worker fall back to the CPU number mod the group
// size n. internal/udpio's "cpu" steering.
func CPUSteering(n int, cpuOf func(int) int) []bpf.Instruction {
	ins := []bpf.Instruction{bpf.LoadExtension{Num: bpf.ExtCPUID}}
	for i := range n {
		// if A == cpu(i) return i
		ins = append(ins, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(cpuOf(i)), SkipTrue: 1}, bpf.RetConstant{Val: uint32(i)})
	}
	return append(ins, bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)}, bpf.RetA{})
}

// ClientPortSteering returns the pod's inline filter: a classic BPF
// program spreading a pod socket's n sockets by the client port of the
// encapsulation header every datagram starts with, so one client's
// datagrams always reach the same reader. A datagram too short to hold a
// port reads as 0 and goes to socket 0, whose reader drops it.
func ClientPortSteering(n int) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: encap.ClientPortOffset, Size: 2},
		bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)},
		bpf.RetA{},
	}
}
