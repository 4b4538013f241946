// Package mmdbfixture builds small GeoIP2-City databases for tests and for
// the dev world's embedded fixture. It lives under internal so that the
// writer library never reaches a production binary.
package mmdbfixture

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
)

// buildEpoch is fixed so that regenerating the fixture from the same records
// gives byte-identical output and a clean diff.
const buildEpoch = 1735689600 // 2025-01-01T00:00:00Z

// Record is one network and the place it maps to.
type Record struct {
	Network  netip.Prefix
	City     string // English name
	Country  string // ISO 3166-1 alpha-2
	Lat, Lon float64
}

// Default are the records of testdata/GeoIP2-City-Test.mmdb: documentation
// and test ranges only (RFC 5737, RFC 3849), one IPv4 and one IPv6 network
// per dev region. Loopback and private ranges are deliberately absent.
var Default = []Record{
	{Network: netip.MustParsePrefix("192.0.2.0/24"), City: "Frankfurt am Main", Country: "DE", Lat: 50.11, Lon: 8.68},
	{Network: netip.MustParsePrefix("198.51.100.0/24"), City: "Ashburn", Country: "US", Lat: 39.04, Lon: -77.49},
	{Network: netip.MustParsePrefix("203.0.113.0/24"), City: "Singapore", Country: "SG", Lat: 1.35, Lon: 103.82},
	{Network: netip.MustParsePrefix("2001:db8:1::/48"), City: "Frankfurt am Main", Country: "DE", Lat: 50.11, Lon: 8.68},
	{Network: netip.MustParsePrefix("2001:db8:2::/48"), City: "Ashburn", Country: "US", Lat: 39.04, Lon: -77.49},
	{Network: netip.MustParsePrefix("2001:db8:3::/48"), City: "Singapore", Country: "SG", Lat: 1.35, Lon: 103.82},
}

// Build writes an IPv6 (IPv4-aliased) GeoIP2-City database holding records,
// with city.names.en, country.iso_code and location.latitude/longitude.
func Build(records []Record) ([]byte, error) {
	tree, err := mmdbwriter.New(mmdbwriter.Options{
		DatabaseType: "GeoIP2-City",
		Description:  map[string]string{"en": "rtcedge test fixture (documentation ranges only)"},
		Languages:    []string{"en"},
		RecordSize:   24,
		BuildEpoch:   buildEpoch,
		// The documentation ranges are reserved networks, which the writer
		// refuses unless told otherwise.
		IncludeReservedNetworks: true,
	})
	if err != nil {
		return nil, fmt.Errorf("new mmdb tree: %w", err)
	}
	for _, r := range records {
		if !r.Network.IsValid() {
			return nil, fmt.Errorf("record %q: invalid network", r.City)
		}
		p := r.Network.Masked()
		n := &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
		v := mmdbtype.Map{
			"city": mmdbtype.Map{"names": mmdbtype.Map{"en": mmdbtype.String(r.City)}},
			"country": mmdbtype.Map{
				"iso_code": mmdbtype.String(r.Country),
			},
			"location": mmdbtype.Map{
				"latitude":        mmdbtype.Float64(r.Lat),
				"longitude":       mmdbtype.Float64(r.Lon),
				"accuracy_radius": mmdbtype.Uint16(20),
			},
		}
		if err := tree.Insert(n, v); err != nil {
			return nil, fmt.Errorf("insert %s: %w", p, err)
		}
	}
	var buf bytes.Buffer
	if _, err := tree.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("write mmdb: %w", err)
	}
	return buf.Bytes(), nil
}
