package geo

import (
	"errors"
	"strings"
	"testing"
)

// steeringCatalogue has regions where distance mis-steers: Johannesburg is
// nearer São Paulo than Frankfurt, and Fukuoka nearer Seoul than Tokyo.
const steeringCatalogue = `
default_region: eu-central
regions:
  - name: eu-central
    location: {lat: 50.11, lon: 8.68}
    clusters: [{id: 1, name: eu-central-1}]
    pops: [{id: 1, name: fra, vip: "192.0.2.1:3478"}]
  - name: sa-east
    location: {lat: -23.55, lon: -46.63}
    clusters: [{id: 2, name: sa-east-1}]
    pops: [{id: 2, name: gru, vip: "192.0.2.2:3478"}]
  - name: ap-northeast-1
    location: {lat: 35.68, lon: 139.69}
    clusters: [{id: 3, name: ap-northeast-1a}]
    pops: [{id: 3, name: nrt, vip: "192.0.2.3:3478"}]
  - name: ap-northeast-2
    location: {lat: 37.57, lon: 126.98}
    clusters: [{id: 4, name: ap-northeast-2a}]
    pops: [{id: 4, name: icn, vip: "192.0.2.4:3478"}]
  - name: ap-southeast
    location: {lat: 1.35, lon: 103.82}
    clusters: [{id: 5, name: ap-southeast-1}]
    pops: [{id: 5, name: sin, vip: "192.0.2.5:3478"}]
`

const steeringOverrides = `
steering:
  countries:
    ZA: [eu-central]
    JP: [ap-northeast-1]
    KE: [ap-southeast]
  continents:
    AF: [eu-central, sa-east]
`

func TestSteeringOverridesWinOverDistance(t *testing.T) {
	plain, err := ParseCatalogue([]byte(steeringCatalogue))
	if err != nil {
		t.Fatal(err)
	}
	steered, err := ParseCatalogue([]byte(steeringCatalogue + steeringOverrides))
	if err != nil {
		t.Fatal(err)
	}
	johannesburg := Location{Point: Point{Lat: -26.20, Lon: 28.05}, Country: "ZA"}
	fukuoka := Location{Point: Point{Lat: 33.59, Lon: 130.40}, Country: "JP"}
	lagos := Location{Point: Point{Lat: 6.52, Lon: 3.38}, Country: "NG"}
	nairobi := Location{Point: Point{Lat: -1.29, Lon: 36.82}, Country: "KE"}
	paris := Location{Point: Point{Lat: 48.86, Lon: 2.35}, Country: "FR"}
	unknown := Location{Point: Point{Lat: -26.20, Lon: 28.05}} // no country: distance only

	tests := []struct {
		name      string
		cat       *Catalogue
		loc       Location
		clusters  []string // regions, in order, of the first clusters
		firstPOPs []string
	}{
		{"South Africa by distance", plain, johannesburg, []string{"sa-east", "ap-southeast"}, []string{"gru", "sin"}},
		{"South Africa steered", steered, johannesburg, []string{"eu-central", "sa-east"}, []string{"fra", "gru"}},
		{"Japan by distance", plain, fukuoka, []string{"ap-northeast-2", "ap-northeast-1"}, []string{"icn", "nrt"}},
		{"Japan steered", steered, fukuoka, []string{"ap-northeast-1", "ap-northeast-2"}, []string{"nrt", "icn"}},
		{"continent entry, listed order", steered, lagos, []string{"eu-central", "sa-east", "ap-southeast"}, []string{"fra", "gru"}},
		{"country wins over its continent", steered, nairobi, []string{"ap-southeast", "eu-central"}, []string{"sin", "fra"}},
		{"no entry: distance", steered, paris, []string{"eu-central", "ap-northeast-2"}, []string{"fra", "icn"}},
		{"no country: distance", steered, unknown, []string{"sa-east", "ap-southeast"}, []string{"gru", "sin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := tt.cat.ChooseFor(tt.loc, nil)
			if len(ch.Clusters) != 5 {
				t.Fatalf("%d clusters, want all 5", len(ch.Clusters))
			}
			for i, want := range tt.clusters {
				if ch.Clusters[i].Region != want {
					t.Errorf("cluster %d in %s, want %s (order %v)", i, ch.Clusters[i].Region, want, regionsOf(ch))
				}
			}
			if got := popNames(ch.POPs); strings.Join(got, ",") != strings.Join(tt.firstPOPs, ",") {
				t.Errorf("POPs %v, want %v", got, tt.firstPOPs)
			}
			if got := popNames(tt.cat.ChoosePOPsFor(tt.loc, 2, nil)); strings.Join(got, ",") != strings.Join(tt.firstPOPs, ",") {
				t.Errorf("ChoosePOPsFor %v, want %v", got, tt.firstPOPs)
			}
		})
	}

	// Health still decides: a draining preferred cluster is skipped, and a
	// down preferred POP gives way to the next.
	draining := func(id uint16) (ClusterState, bool) { return ClusterState{Healthy: true, Draining: id == 1}, true }
	if ch := steered.ChooseFor(johannesburg, draining); ch.Clusters[0].Region != "sa-east" {
		t.Errorf("with eu-central draining, first cluster in %s", ch.Clusters[0].Region)
	}
	fraDown := func(id uint16) bool { return id != 1 }
	if got := popNames(steered.ChoosePOPsFor(johannesburg, 2, fraDown)); got[0] != "gru" {
		t.Errorf("with fra down, POPs %v", got)
	}
	// Choose and ChoosePOPs stay distance-only.
	if ch := steered.Choose(johannesburg.Point, nil); ch.Clusters[0].Region != "sa-east" {
		t.Errorf("Choose applied overrides: %v", regionsOf(ch))
	}
}

func regionsOf(ch Choice) []string {
	var out []string
	for _, c := range ch.Clusters {
		out = append(out, c.Region)
	}
	return out
}

func popNames(pops []POP) []string {
	var out []string
	for _, p := range pops {
		out = append(out, p.Name)
	}
	return out
}

func TestSteeringValidation(t *testing.T) {
	tests := []struct {
		name, steering, want string
	}{
		{"unknown country", "steering:\n  countries:\n    XX: [eu-central]\n", `"XX" is not an ISO 3166-1`},
		{"lower case country", "steering:\n  countries:\n    za: [eu-central]\n", `"za" is not an ISO 3166-1`},
		{"unknown continent", "steering:\n  continents:\n    EA: [eu-central]\n", `"EA" is not a continent code`},
		{"unknown region", "steering:\n  countries:\n    ZA: [mars]\n", `"mars" is not a region`},
		{"region without cluster", "steering:\n  countries:\n    ZA: [pop-only]\n", `"pop-only" has no cluster`},
		{"repeated region", "steering:\n  countries:\n    ZA: [eu-central, eu-central]\n", "listed twice"},
		{"empty list", "steering:\n  continents:\n    AF: []\n", "no regions listed"},
	}
	base := steeringCatalogue + "  - name: pop-only\n    location: {lat: 0, lon: 1}\n    pops: [{id: 9, name: x, vip: \"192.0.2.9:3478\"}]\n"
	if _, err := ParseCatalogue([]byte(base + steeringOverrides)); err != nil {
		t.Fatalf("valid catalogue: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCatalogue([]byte(base + tt.steering))
			if !errors.Is(err, ErrInvalidCatalogue) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestContinentTable(t *testing.T) {
	seen := map[string]string{}
	for cont, list := range countriesByContinent {
		prev := ""
		for _, cc := range strings.Fields(list) {
			if other, dup := seen[cc]; dup {
				t.Errorf("%s listed in %s and %s", cc, other, cont)
			}
			seen[cc] = cont
			if len(cc) != 2 || strings.ToUpper(cc) != cc {
				t.Errorf("%s: malformed code %q", cont, cc)
			}
			if cc <= prev {
				t.Errorf("%s: %s out of order after %s", cont, cc, prev)
			}
			prev = cc
		}
	}
	// 249 ISO 3166-1 codes plus XK.
	if len(seen) != 250 {
		t.Errorf("%d countries, want 250", len(seen))
	}
	for cc, want := range map[string]string{"ZA": "AF", "JP": "AS", "BR": "SA", "US": "NA", "DE": "EU", "AU": "OC", "AQ": "AN"} {
		if got := ContinentOf(cc); got != want {
			t.Errorf("ContinentOf(%s) = %q, want %s", cc, got, want)
		}
	}
}
