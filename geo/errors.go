package geo

import "errors"

// Sentinel errors. Callers match them with errors.Is; the returned errors wrap
// them with the detail (which entry, which field) an operator needs to fix the
// input.
var (
	// ErrInvalidCatalogue is wrapped by every catalogue problem found while
	// decoding or validating: unknown keys, duplicate IDs or names, bad VIPs,
	// coordinates out of range, a missing default region, and so on.
	ErrInvalidCatalogue = errors.New("invalid region catalogue")

	// ErrInvalidLocatorConfig is wrapped when a LocatorConfig cannot be used,
	// for example when both DBPath and DB are set.
	ErrInvalidLocatorConfig = errors.New("invalid locator config")

	// ErrInvalidGeoIPDB is wrapped when a GeoIP database cannot be opened or is
	// not a City-type database.
	ErrInvalidGeoIPDB = errors.New("invalid GeoIP database")
)
