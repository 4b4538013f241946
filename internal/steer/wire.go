package steer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Samples travel between roles as gossip user messages (datagrams,
// encrypted with the pool's key). A pod sends its report (report.go) to
// one cluster relay of its cluster pool; the relay checks it and passes
// its samples, stamped with the pod as their reporter, to every signaling
// member of the global pool (which pods are not in) as samples messages;
// a signaling replica that takes samples from `rtcedge probe` passes them
// on to the other replicas the same way, stamped with the probe's key.
//
//	message: MsgKind (1) | version 2 (1) | source (1) | reporter (4) | count (1) | count × sample
//	sample:  key length (1) | key text (Key.String) | POP (2) | RTT in 100 µs (2)
//
// Integers are big-endian. A pod's reporter is PodReporter (its cluster is
// not 0), a probe's ProbeReporter (cluster 0).

// MsgKind is the first byte of a samples message; other gossip user
// messages start with other bytes.
const MsgKind = 'S'

const wireVersion = 2

const headerLen = 8

// MaxMessage bounds a samples message: it must fit a gossip datagram.
const MaxMessage = 1200

// Source says who measured a batch of samples.
type Source uint8

// Sources of samples.
const (
	SourcePod   Source = 1 // a pod's probe of a call's client through a POP
	SourceProbe Source = 2 // a synthetic client of `rtcedge probe`
)

// String names the source in metrics.
func (s Source) String() string {
	switch s {
	case SourcePod:
		return "pod"
	case SourceProbe:
		return "probe"
	}
	return "unknown"
}

var errMessage = errors.New("steer: malformed samples message")

// AppendMessage appends to b one message of samples from reporter from
// with as many of samples as fit in MaxMessage and returns it with the
// number taken.
func AppendMessage(b []byte, src Source, from Reporter, samples []Sample) ([]byte, int) {
	start := len(b)
	b = append(b, MsgKind, wireVersion, byte(src))
	b = binary.BigEndian.AppendUint32(b, uint32(from))
	b = append(b, 0)
	n := 0
	for _, s := range samples {
		if n == 255 {
			break
		}
		key := s.Key.String()
		if len(b)-start+1+len(key)+4 > MaxMessage {
			break
		}
		b = append(b, byte(len(key)))
		b = append(b, key...)
		b = binary.BigEndian.AppendUint16(b, s.POP)
		b = binary.BigEndian.AppendUint16(b, uint16(min(MaxRTT, max(rttUnit, s.RTT))/rttUnit))
		n++
	}
	b[start+headerLen-1] = byte(n)
	return b, n
}

// ParseMessage reads a samples message whole, or fails: a message with
// one bad sample, or whose reporter is not of its source's kind, is
// garbage (it came through an authenticated pool, so it is a bug or a
// version skew, and counted as such).
func ParseMessage(b []byte) (Source, Reporter, []Sample, error) {
	if len(b) < headerLen || b[0] != MsgKind || b[1] != wireVersion || len(b) > MaxMessage {
		return 0, 0, nil, errMessage
	}
	src, from, count := Source(b[2]), Reporter(binary.BigEndian.Uint32(b[3:])), int(b[7])
	if (src != SourcePod || !from.IsPod()) && (src != SourceProbe || from.IsPod()) {
		return 0, 0, nil, errMessage
	}
	b = b[headerLen:]
	out := make([]Sample, 0, count)
	for range count {
		s, rest, err := readSample(b)
		if err != nil {
			return 0, 0, nil, err
		}
		out = append(out, s)
		b = rest
	}
	if len(b) != 0 {
		return 0, 0, nil, errMessage
	}
	return src, from, out, nil
}

// readSample reads one sample: key length, key, POP, RTT.
func readSample(b []byte) (Sample, []byte, error) {
	if len(b) < 1 || len(b) < 1+int(b[0])+4 {
		return Sample{}, nil, errMessage
	}
	kl := int(b[0])
	k, err := ParseKey(string(b[1 : 1+kl]))
	if err != nil {
		return Sample{}, nil, fmt.Errorf("%w: %w", errMessage, err)
	}
	b = b[1+kl:]
	s := Sample{Key: k, POP: binary.BigEndian.Uint16(b), RTT: time.Duration(binary.BigEndian.Uint16(b[2:])) * rttUnit}
	if err := s.check(); err != nil {
		return Sample{}, nil, fmt.Errorf("%w: %w", errMessage, err)
	}
	return s, b[4:], nil
}
