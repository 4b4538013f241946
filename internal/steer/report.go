package steer

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
)

// A pod's report: the round trips it measured, sent as one gossip user
// message of its cluster pool to one cluster relay, which checks it
// (Authority.Check) and passes the samples on as samples messages stamped
// with the pod as their reporter (wire.go).
//
//	report: ReportKind (1) | version 1 (1) | cluster (2) | pod (2) | key ID (1) | count (1) | count × call | tag (16)
//	call:   key length (1) | key text | ticket (TicketLen) | POP count (1) | POPs (2 each) | sample count (1) | samples
//	sample: POP (2) | RTT in 100 µs (2)
//	ticket: key ID (1) | issued, Unix seconds (4) | tag (16)
//
// The report's tag is HMAC-SHA256 (first 16 bytes) under the pod's own
// report key (key ID names it) over all bytes before it: only the holder
// of that pod's keys can report as that pod. A ticket is what the
// cluster's session API front gave the pod with the call's create
// (Authority.Mint): HMAC-SHA256 under the cluster's ticket key, which
// relays hold and pods do not, over the cluster, the pod, the time of
// issue, the call's steering key and the POPs it was offered. So a pod
// reports only for callers' networks and POPs that signaling placed on it
// recently; a call's ticket counts for TicketMaxAge. Without an authority
// (shared keys, docs/operations.md) key IDs and tags are zero and the
// relay checks nothing but the format.

// ReportKind is the first byte of a pod's report.
const ReportKind = 'R'

const reportVersion = 1

// TagLen is the length of a report's or ticket's tag.
const TagLen = 16

// TicketLen is the length of a ticket on the wire.
const TicketLen = 1 + 4 + TagLen

// MaxTicketPOPs bounds the POPs a ticket names, and so the POPs, hence
// the candidates, of one answer: the transceiver's bound is this one.
const MaxTicketPOPs = 4

// TicketMaxAge is how long after its create a call's samples are taken:
// a pod measures a call once it is connected, within seconds.
const TicketMaxAge = 2 * time.Minute

// ticketSkew is how far in the future a ticket's issue time may lie (the
// clocks of a cluster's relays differ a little).
const ticketSkew = 10 * time.Second

const ticketLabel = "rtcedge steer ticket v1"

// Ticket binds a call's samples to the pod, steering key and POPs its
// create named; see the format above.
type Ticket struct {
	KeyID  uint8
	Issued uint32 // Unix seconds
	Tag    [TagLen]byte
}

// String is the ticket's text form (base64url): the front's header.
func (t Ticket) String() string {
	return base64.RawURLEncoding.EncodeToString(t.append(nil))
}

func (t Ticket) append(b []byte) []byte {
	b = append(b, t.KeyID)
	b = binary.BigEndian.AppendUint32(b, t.Issued)
	return append(b, t.Tag[:]...)
}

// ParseTicket reads String's form.
func ParseTicket(s string) (Ticket, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != TicketLen {
		return Ticket{}, errors.New("steer: malformed ticket")
	}
	return readTicket(b), nil
}

func readTicket(b []byte) Ticket {
	t := Ticket{KeyID: b[0], Issued: binary.BigEndian.Uint32(b[1:])}
	copy(t.Tag[:], b[5:TicketLen])
	return t
}

// RTT is one round trip a call measured through one of its POPs.
type RTT struct {
	POP uint16
	RTT time.Duration
}

// Call is what one call measured, with its ticket.
type Call struct {
	Key    Key
	Ticket Ticket
	POPs   []uint16 // the POPs the call was offered, as its ticket names them
	RTTs   []RTT
}

// Report is a pod's report as parsed; Authority.Check says whether it
// may be believed.
type Report struct {
	Cluster, Pod uint16
	KeyID        uint8 // of the report key; 0: unsigned
	Calls        []Call
	signed       []byte // the bytes the tag covers
	tag          [TagLen]byte
}

// Samples are the report's samples, in order.
func (r *Report) Samples() []Sample {
	var out []Sample
	for _, c := range r.Calls {
		for _, x := range c.RTTs {
			out = append(out, Sample{Key: c.Key, POP: x.POP, RTT: x.RTT})
		}
	}
	return out
}

func reportTag(key, b []byte) [TagLen]byte {
	var t [TagLen]byte
	if key != nil {
		h := hmac.New(sha256.New, key)
		h.Write(b)
		copy(t[:], h.Sum(nil))
	}
	return t
}

// AppendReport appends to b one report of the pod (cluster, pod) with as
// many of calls as fit in MaxMessage, tagged under key (report key ID
// keyID; nil key: unsigned), and returns it with the number of calls
// taken. A call with more POPs than MaxTicketPOPs, or more RTTs than 255,
// is cut.
func AppendReport(b []byte, cluster, pod uint16, keyID uint8, key []byte, calls []Call) ([]byte, int) {
	start := len(b)
	b = append(b, ReportKind, reportVersion)
	b = binary.BigEndian.AppendUint16(b, cluster)
	b = binary.BigEndian.AppendUint16(b, pod)
	b = append(b, keyID, 0)
	n := 0
	for _, c := range calls {
		if n == 255 {
			break
		}
		text := c.Key.String()
		pops, rtts := c.POPs[:min(len(c.POPs), MaxTicketPOPs)], c.RTTs[:min(len(c.RTTs), 255)]
		if len(b)-start+1+len(text)+TicketLen+1+2*len(pops)+1+4*len(rtts)+TagLen > MaxMessage {
			break
		}
		b = append(b, byte(len(text)))
		b = append(b, text...)
		b = c.Ticket.append(b)
		b = append(b, byte(len(pops)))
		for _, p := range pops {
			b = binary.BigEndian.AppendUint16(b, p)
		}
		b = append(b, byte(len(rtts)))
		for _, x := range rtts {
			b = binary.BigEndian.AppendUint16(b, x.POP)
			b = binary.BigEndian.AppendUint16(b, uint16(min(MaxRTT, max(rttUnit, x.RTT))/rttUnit))
		}
		n++
	}
	b[start+7] = byte(n)
	tag := reportTag(key, b[start:])
	return append(b, tag[:]...), n
}

var errReport = errors.New("steer: malformed report")

// ParseReport reads a report whole, or fails. It checks the format only;
// Authority.Check decides whether to believe it.
func ParseReport(b []byte) (Report, error) {
	if len(b) < 8+TagLen || b[0] != ReportKind || b[1] != reportVersion || len(b) > MaxMessage {
		return Report{}, errReport
	}
	r := Report{Cluster: binary.BigEndian.Uint16(b[2:]), Pod: binary.BigEndian.Uint16(b[4:]), KeyID: b[6], signed: b[:len(b)-TagLen]}
	copy(r.tag[:], b[len(b)-TagLen:])
	count := int(b[7])
	p := b[8 : len(b)-TagLen]
	r.Calls = make([]Call, 0, count)
	for range count {
		if len(p) < 1 || len(p) < 1+int(p[0])+TicketLen+1 {
			return Report{}, errReport
		}
		k, err := ParseKey(string(p[1 : 1+int(p[0])]))
		if err != nil {
			return Report{}, fmt.Errorf("%w: %w", errReport, err)
		}
		p = p[1+int(p[0]):]
		c := Call{Key: k, Ticket: readTicket(p)}
		p = p[TicketLen:]
		np := int(p[0])
		if np == 0 || np > MaxTicketPOPs || len(p) < 1+2*np+1 {
			return Report{}, errReport
		}
		for i := range np {
			c.POPs = append(c.POPs, binary.BigEndian.Uint16(p[1+2*i:]))
		}
		p = p[1+2*np:]
		ns := int(p[0])
		if len(p) < 1+4*ns {
			return Report{}, errReport
		}
		for i := range ns {
			x := RTT{POP: binary.BigEndian.Uint16(p[1+4*i:]), RTT: time.Duration(binary.BigEndian.Uint16(p[3+4*i:])) * rttUnit}
			if err := (Sample{Key: k, POP: x.POP, RTT: x.RTT}).check(); err != nil {
				return Report{}, fmt.Errorf("%w: %w", errReport, err)
			}
			c.RTTs = append(c.RTTs, x)
		}
		p = p[1+4*ns:]
		r.Calls = append(r.Calls, c)
	}
	if len(p) != 0 || r.Cluster == 0 {
		return Report{}, errReport
	}
	return r, nil
}

// Authority is a cluster relay's side of reports and tickets: the keys
// of its cluster that the deployment authority derives
// (internal/authority), and the key it signs the samples messages it
// passes on with (wire.go). It is immutable and safe for concurrent use.
type Authority struct {
	Cluster uint16
	// Signer signs the samples messages made of the reports believed:
	// the cluster's relay key (nil: they go unsigned, and signaling
	// replicas holding keys drop them).
	Signer *Signer
	// TicketID is the key ID tickets are minted under.
	TicketID uint8
	// TicketKey is the cluster's ticket key of an ID, nil if unknown.
	TicketKey func(id uint8) []byte
	// ReportKey is a pod's report key of an ID, nil if unknown.
	ReportKey func(id uint8, pod uint16) []byte
}

func ticketInput(cluster, pod uint16, issued uint32, k Key, pops []uint16) []byte {
	b := append(make([]byte, 0, 96), ticketLabel...)
	b = binary.BigEndian.AppendUint16(b, cluster)
	b = binary.BigEndian.AppendUint16(b, pod)
	b = binary.BigEndian.AppendUint32(b, issued)
	text := k.String()
	b = append(b, byte(len(text)))
	b = append(b, text...)
	b = append(b, byte(len(pops)))
	for _, p := range pops {
		b = binary.BigEndian.AppendUint16(b, p)
	}
	return b
}

// Mint is the ticket of a call with steering key k offered pops (1 to
// MaxTicketPOPs of them), placed on pod at now.
func (a *Authority) Mint(pod uint16, k Key, pops []uint16, now time.Time) (Ticket, error) {
	key := a.TicketKey(a.TicketID)
	if !k.Valid() || len(pops) == 0 || len(pops) > MaxTicketPOPs || key == nil {
		return Ticket{}, fmt.Errorf("steer: no ticket for key %q, %d POPs", k, len(pops))
	}
	t := Ticket{KeyID: a.TicketID, Issued: uint32(now.Unix())}
	t.Tag = reportTag(key, ticketInput(a.Cluster, pod, t.Issued, k, pops))
	return t, nil
}

// ErrReport is wrapped by every refusal of Check.
var ErrReport = errors.New("steer: report refused")

// Check believes r only whole: it must come from a's cluster, carry its
// pod's tag, and every call a ticket of that pod, for its key and POPs,
// issued within TicketMaxAge of now, and every sample a POP of its
// call's ticket.
func (a *Authority) Check(r *Report, now time.Time) error {
	if r.Cluster != a.Cluster {
		return fmt.Errorf("%w: cluster %d in cluster %d's pool", ErrReport, r.Cluster, a.Cluster)
	}
	rk := a.ReportKey(r.KeyID, r.Pod)
	if want := reportTag(rk, r.signed); rk == nil || subtle.ConstantTimeCompare(want[:], r.tag[:]) != 1 {
		return fmt.Errorf("%w: pod %d: tag does not verify", ErrReport, r.Pod)
	}
	t := now.Unix()
	for _, c := range r.Calls {
		tk := a.TicketKey(c.Ticket.KeyID)
		if tk == nil {
			return fmt.Errorf("%w: pod %d: ticket key ID %d unknown", ErrReport, r.Pod, c.Ticket.KeyID)
		}
		if age := t - int64(c.Ticket.Issued); age > int64(TicketMaxAge/time.Second) || age < -int64(ticketSkew/time.Second) {
			return fmt.Errorf("%w: pod %d: ticket of %s issued %d s ago", ErrReport, r.Pod, c.Key, age)
		}
		want := reportTag(tk, ticketInput(a.Cluster, r.Pod, c.Ticket.Issued, c.Key, c.POPs))
		if subtle.ConstantTimeCompare(want[:], c.Ticket.Tag[:]) != 1 {
			return fmt.Errorf("%w: pod %d: no ticket for %s through %v", ErrReport, r.Pod, c.Key, c.POPs)
		}
		for _, x := range c.RTTs {
			if !slices.Contains(c.POPs, x.POP) {
				return fmt.Errorf("%w: pod %d: %s through POP %d, not one of its call's %v", ErrReport, r.Pod, c.Key, x.POP, c.POPs)
			}
		}
	}
	return nil
}
