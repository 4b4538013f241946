package geo

import _ "embed" // for DevGeoIPDB

//go:generate go run ./internal/mkfixture -out testdata/GeoIP2-City-Test.mmdb

// DevGeoIPDB is a tiny GeoIP2-City database for the dev world and tests. It
// maps only documentation ranges: 192.0.2.0/24 and 2001:db8:1::/48 to
// Frankfurt, 198.51.100.0/24 and 2001:db8:2::/48 to Ashburn, 203.0.113.0/24
// and 2001:db8:3::/48 to Singapore. Pass it as LocatorConfig.DB; never
// modify it. See testdata/README.md for how it is regenerated.
//
//go:embed testdata/GeoIP2-City-Test.mmdb
var DevGeoIPDB []byte
