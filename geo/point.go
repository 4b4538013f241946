// Package geo locates clients and picks the clusters and relay POPs nearest to
// them.
//
// It has three parts:
//
//   - Locator turns an HTTP request into a location: trusted Cloudflare
//     visitor-location headers when the peer is a trusted proxy, otherwise a
//     MaxMind GeoIP2/GeoLite2 City lookup of the client address, otherwise a
//     configured default.
//   - Catalogue is the static list of regions with their clusters and global
//     relay POPs, loaded strictly from YAML.
//   - Catalogue.Choose ranks clusters by great-circle distance, skipping the
//     ones gossip reports as unhealthy, draining or full, and picks the
//     nearest POP plus a backup.
//
// Everything here is read-only after construction except the Locator's
// database, which Run swaps atomically when the file on disk changes.
package geo

import "math"

// earthRadiusKm is the mean Earth radius; the haversine error from treating
// the Earth as a sphere (<0.5 %) is irrelevant for ranking regions.
const earthRadiusKm = 6371.0

// Point is a location in degrees (WGS 84 latitude and longitude).
type Point struct {
	Lat float64 `yaml:"lat" json:"lat"`
	Lon float64 `yaml:"lon" json:"lon"`
}

// Valid reports whether p is a finite coordinate with latitude in [-90, 90]
// and longitude in [-180, 180].
func (p Point) Valid() bool {
	return !math.IsNaN(p.Lat) && !math.IsNaN(p.Lon) &&
		p.Lat >= -90 && p.Lat <= 90 && p.Lon >= -180 && p.Lon <= 180
}

// DistanceKm returns the great-circle distance between a and b in kilometres,
// computed with the haversine formula on a sphere of radius 6371 km.
func DistanceKm(a, b Point) float64 {
	const rad = math.Pi / 180
	lat1, lat2 := a.Lat*rad, b.Lat*rad
	dLat := (b.Lat - a.Lat) * rad
	dLon := (b.Lon - a.Lon) * rad
	sLat, sLon := math.Sin(dLat/2), math.Sin(dLon/2)
	h := sLat*sLat + math.Cos(lat1)*math.Cos(lat2)*sLon*sLon
	// Rounding can push h a hair above 1 for antipodal points; clamp so Asin
	// never returns NaN.
	h = min(h, 1)
	return 2 * earthRadiusKm * math.Asin(math.Sqrt(h))
}
