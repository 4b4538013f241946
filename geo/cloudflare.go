package geo

import (
	_ "embed"
	"fmt"
	"net/netip"
	"strings"
)

//go:embed cloudflare-ranges.txt
var cloudflareRanges string

// CloudflareKeyword, as an entry of a proxy list (ParsePrefixes), stands
// for all of CloudflareRanges.
const CloudflareKeyword = "cloudflare"

// CloudflareRanges returns Cloudflare's published IPv4 and IPv6 edge
// ranges, shipped with rtcedge in cloudflare-ranges.txt. A new slice each
// call.
func CloudflareRanges() []netip.Prefix {
	var out []netip.Prefix
	for _, line := range strings.Split(cloudflareRanges, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, netip.MustParsePrefix(line))
	}
	return out
}

// ParsePrefixes parses a config's list of CIDR prefixes; the entry
// "cloudflare" expands to CloudflareRanges.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		if strings.EqualFold(strings.TrimSpace(s), CloudflareKeyword) {
			out = append(out, CloudflareRanges()...)
			continue
		}
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("proxy prefix %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
