package cloudflare

import (
	"slices"
	"strings"
)

// RegionCodes are the region codes Cloudflare's load balancing API accepts
// in region_pools and a pool's check_regions (its documented enumeration):
// Western and Eastern North America, Western and Eastern Europe, Northern
// and Southern South America, Oceania, Middle East, Northern and Southern
// Africa, Southern, Southeast and Northeast Asia. There is no "SAM".
var RegionCodes = []string{"WNAM", "ENAM", "WEU", "EEU", "NSAM", "SSAM", "OC", "ME", "NAF", "SAF", "SAS", "SEAS", "NEAS"}

// ValidRegionCode reports whether code is one of RegionCodes.
func ValidRegionCode(code string) bool { return slices.Contains(RegionCodes, code) }

// regionCodeHint says what to write instead of an invalid region code.
func regionCodeHint(code string) string {
	hint := "valid codes: " + strings.Join(RegionCodes, ", ")
	if code == "SAM" {
		hint = "South America is NSAM (northern) and SSAM (southern); " + hint
	}
	return hint
}
