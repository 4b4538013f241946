package signaling_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/signaling"
)

// TestSignalingAppliesSteeringOverrides checks that the catalogue's
// per-country preferences win over distance in signaling's choice of
// cluster and POPs, and only for the listed country.
func TestSignalingAppliesSteeringOverrides(t *testing.T) {
	w := newWorld(t, worldConfig{
		proxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		tweak: func(c *signaling.Config) {
			c.CatalogueData.Steering = geo.Steering{Countries: map[string][]string{"SG": {"us-east"}}}
		},
	})
	offer := testsdp.Offer(t)
	fromSingapore := func(country string) http.Header {
		return http.Header{"Cf-Connecting-Ip": {ipSingapore}, "Cf-Iplatitude": {"1.29"}, "Cf-Iplongitude": {"103.85"}, "Cf-Ipcountry": {country}}
	}
	for _, tc := range []struct {
		name, country string
		want          placement
	}{
		{"overridden country", "SG", placement{"us-east", "2", "iad", "sin"}},
		{"other country at the same point", "MY", inSingapore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", "10.1.2.3", "application/sdp", offer, fromSingapore(tc.country))
			res, body := recorded(rec)
			checkPlaced(t, res, body, tc.want)
			w.hangup(t, rec, nil)
		})
	}
}
