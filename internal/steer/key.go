package steer

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Key is a caller's place in the network: the prefix of its address (a
// /24 for IPv4, a /48 for IPv6: what one access network or carrier site
// usually shares) and a coarse location (whole degrees of latitude and
// longitude, or none when the caller could not be located). It is a small
// comparable value, copied freely.
type Key struct {
	addr [16]byte // the prefix's first address, IPv4 as IPv4-mapped
	bits uint8    // prefix length in the IPv6 sense (IPv4 /24 is 96+24)
	lat  int8     // whole degrees, truncated towards zero; unlocated: not located
	lon  int16
}

// unlocated is Key.lat for a caller that could not be located.
const unlocated = math.MinInt8

func (k Key) located() bool { return k.lat != unlocated }

// Prefix lengths of a Key.
const (
	V4Bits = 24
	V6Bits = 48
)

// KeyFor is the key of a caller at addr, located at (lat, lon) when
// located is set. It is the zero Key (Valid reports false) for an invalid
// address.
func KeyFor(addr netip.Addr, located bool, lat, lon float64) Key {
	if !addr.IsValid() {
		return Key{}
	}
	addr = addr.Unmap()
	var p netip.Prefix
	if addr.Is4() {
		p, _ = addr.Prefix(V4Bits)
	} else {
		p, _ = addr.WithZone("").Prefix(V6Bits)
	}
	k := Key{addr: p.Addr().As16(), bits: uint8(p.Bits()), lat: unlocated}
	if addr.Is4() {
		k.bits += 96
	}
	if located && !math.IsNaN(lat) && !math.IsNaN(lon) {
		k.lat = int8(max(-90, min(90, lat)))
		k.lon = int16(max(-180, min(180, lon)))
	}
	return k
}

// Valid reports whether k names a prefix.
func (k Key) Valid() bool { return k.bits != 0 }

// Prefix is k's address prefix.
func (k Key) Prefix() netip.Prefix {
	a := netip.AddrFrom16(k.addr)
	bits := int(k.bits)
	if a.Is4In6() {
		a, bits = a.Unmap(), bits-96
	}
	return netip.PrefixFrom(a, bits)
}

// String is k's text form, "198.51.100.0/24@48,2" (or "…@-" when not
// located): what signaling hands the pod with a call and the pod reports
// back with its measurements (ParseKey reads it).
func (k Key) String() string {
	if !k.Valid() {
		return ""
	}
	loc := "-"
	if k.located() {
		loc = strconv.Itoa(int(k.lat)) + "," + strconv.Itoa(int(k.lon))
	}
	return k.Prefix().String() + "@" + loc
}

// MaxKeyLen bounds the text form of a key.
const MaxKeyLen = 64

var errKey = errors.New("steer: malformed key")

// ParseKey reads String's form. Only the prefix lengths KeyFor makes are
// accepted, and the prefix must have no host bits.
func ParseKey(s string) (Key, error) {
	if len(s) > MaxKeyLen {
		return Key{}, errKey
	}
	ps, loc, ok := strings.Cut(s, "@")
	if !ok {
		return Key{}, errKey
	}
	p, err := netip.ParsePrefix(ps)
	if err != nil || p.Masked() != p || (p.Addr().Is4() && p.Bits() != V4Bits) || (p.Addr().Is6() && p.Bits() != V6Bits) || p.Addr().Zone() != "" {
		return Key{}, errKey
	}
	k := KeyFor(p.Addr(), false, 0, 0)
	if loc == "-" {
		return k, nil
	}
	las, los, ok := strings.Cut(loc, ",")
	lat, err1 := strconv.Atoi(las)
	lon, err2 := strconv.Atoi(los)
	if !ok || err1 != nil || err2 != nil || lat < -90 || lat > 90 || lon < -180 || lon > 180 {
		return Key{}, errKey
	}
	k.lat, k.lon = int8(lat), int16(lon)
	return k, nil
}

// errSample is a sample whose fields are out of range.
var errSample = errors.New("steer: sample out of range")

// Sample is one measured round trip between a caller's network and a POP.
type Sample struct {
	Key Key
	POP uint16
	RTT time.Duration
}

func (s Sample) check() error {
	if !s.Key.Valid() || s.POP == 0 || s.RTT <= 0 || s.RTT > MaxRTT {
		return fmt.Errorf("%w: key %q, POP %d, RTT %v", errSample, s.Key, s.POP, s.RTT)
	}
	return nil
}
