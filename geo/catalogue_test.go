package geo

import (
	"errors"
	"math"
	"net/netip"
	"strings"
	"testing"
)

func TestLoadSampleCatalogue(t *testing.T) {
	c, err := LoadCatalogue("testdata/catalogue.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.DefaultRegion != "eu-central" || len(c.Regions) != 3 {
		t.Fatalf("got default %q and %d regions", c.DefaultRegion, len(c.Regions))
	}
	cl, r, ok := c.Cluster(2)
	if !ok || r.Name != "us-east" || cl.Location != r.Location || cl.SessionAPI != "http://127.0.0.1:8082" {
		t.Errorf("Cluster(2) = %+v, %q, %v", cl, r.Name, ok)
	}
	p, ok := c.POP(3)
	if !ok || p.VIP != netip.MustParseAddrPort("127.0.0.4:3478") || p.Location != (Point{1.35, 103.82}) {
		t.Errorf("POP(3) = %+v, %v", p, ok)
	}
	if _, ok := c.POP(9); ok {
		t.Error("POP(9) found")
	}
	if _, _, ok := c.Cluster(9); ok {
		t.Error("Cluster(9) found")
	}
	if r, ok := c.ClusterRegion(2); !ok || r != "us-east" {
		t.Errorf("ClusterRegion(2) = %q, %v", r, ok)
	}
	if _, ok := c.ClusterRegion(9); ok {
		t.Error("ClusterRegion(9) found")
	}
	if !c.HasPOP(3) || c.HasPOP(9) {
		t.Errorf("HasPOP(3) = %v, HasPOP(9) = %v", c.HasPOP(3), c.HasPOP(9))
	}
	if _, ok := c.Region("nowhere"); ok {
		t.Error("Region(nowhere) found")
	}
	if got := c.DefaultLocation(); got != (Point{50.11, 8.68}) {
		t.Errorf("DefaultLocation = %v", got)
	}
}

func TestLoadCatalogueMissingFile(t *testing.T) {
	if _, err := LoadCatalogue("testdata/does-not-exist.yaml"); err == nil {
		t.Fatal("want error")
	}
}

func TestParseCatalogueDefaultsAndOverrides(t *testing.T) {
	c, err := ParseCatalogue([]byte(`
default_region: r
regions:
  - name: r
    location: {lat: 10, lon: 20}
    clusters:
      - {id: 7, name: a}
      - {id: 8, name: b, location: {lat: 0, lon: 0}}
    pops:
      - {id: 1, name: p, vip: "[2001:db8::1]:3478"}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := c.Cluster(7)
	b, _, _ := c.Cluster(8)
	p, _ := c.POP(1)
	if a.Location != (Point{10, 20}) || b.Location != (Point{0, 0}) || p.Location != (Point{10, 20}) {
		t.Errorf("locations: a=%v b=%v pop=%v", a.Location, b.Location, p.Location)
	}
	if p.VIP != netip.MustParseAddrPort("[2001:db8::1]:3478") {
		t.Errorf("vip = %v", p.VIP)
	}
}

func TestParseCatalogueErrors(t *testing.T) {
	const base = `
default_region: eu
regions:
  - name: eu
    location: {lat: 50, lon: 8}
    clusters:
      - {id: 1, name: eu-1}
    pops:
      - {id: 1, name: fra, vip: "192.0.2.1:3478"}
`
	tests := []struct {
		name string
		yaml string
		want string // substring of the error
	}{
		{"unknown top-level key", base + "extra: 1\n", "field extra not found"},
		{"unknown nested key", strings.Replace(base, "{id: 1, name: eu-1}", "{id: 1, name: eu-1, weight: 3}", 1), "field weight not found"},
		{"duplicate cluster id", base + `  - name: us
    location: {lat: 39, lon: -77}
    clusters:
      - {id: 1, name: us-1}
`, "cluster 1: duplicate id"},
		{"duplicate pop id", base + `  - name: us
    location: {lat: 39, lon: -77}
    pops:
      - {id: 1, name: iad, vip: "192.0.2.2:3478"}
`, "pop 1: duplicate id"},
		{"duplicate region", base + `  - name: eu
    location: {lat: 39, lon: -77}
    clusters:
      - {id: 2, name: us-1}
`, `region "eu": duplicate name`},
		{"duplicate cluster name", base + `  - name: us
    location: {lat: 39, lon: -77}
    clusters:
      - {id: 2, name: eu-1}
`, `cluster "eu-1": duplicate name`},
		{"bad vip", strings.Replace(base, "192.0.2.1:3478", "not-an-address", 1), "not-an-address"},
		{"vip without port", strings.Replace(base, "192.0.2.1:3478", "192.0.2.1", 1), "192.0.2.1"},
		{"vip port zero", strings.Replace(base, "192.0.2.1:3478", "192.0.2.1:0", 1), "non-zero port"},
		{"missing vip", strings.Replace(base, `, vip: "192.0.2.1:3478"`, "", 1), "non-zero port"},
		{"cluster id zero", strings.Replace(base, "{id: 1, name: eu-1}", "{id: 0, name: eu-1}", 1), "id must be 1..65535"},
		{"cluster id too large", strings.Replace(base, "{id: 1, name: eu-1}", "{id: 65536, name: eu-1}", 1), "65536"},
		{"latitude out of range", strings.Replace(base, "lat: 50", "lat: 91", 1), "out of range"},
		{"longitude out of range", strings.Replace(base, "lon: 8", "lon: -181", 1), "out of range"},
		{"half a point", strings.Replace(base, "{lat: 50, lon: 8}", "{lat: 50}", 1), "both lat and lon"},
		{"region without location", strings.Replace(base, "    location: {lat: 50, lon: 8}\n", "", 1), "location is required"},
		{"unknown default region", strings.Replace(base, "default_region: eu", "default_region: mars", 1), `"mars" is not a region`},
		{"no default region", strings.Replace(base, "default_region: eu\n", "", 1), "default_region is required"},
		{"empty region", base + "  - name: us\n    location: {lat: 39, lon: -77}\n", "at least one cluster or pop"},
		{"no clusters at all", strings.Replace(base, "    clusters:\n      - {id: 1, name: eu-1}\n", "", 1), "at least one cluster is required"},
		{"bad session api", strings.Replace(base, "{id: 1, name: eu-1}", "{id: 1, name: eu-1, session_api: 'localhost:80'}", 1), "session_api"},
		{"empty document", "", "empty document"},
		{"two documents", base + "---\n" + base, "more than one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCatalogue([]byte(tt.yaml))
			if err == nil {
				t.Fatal("want error")
			}
			if !errors.Is(err, ErrInvalidCatalogue) {
				t.Errorf("error %v does not wrap ErrInvalidCatalogue", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestValidateReportsNaN(t *testing.T) {
	c := &Catalogue{DefaultRegion: "r", Regions: []Region{{
		Name: "r", Location: Point{math.NaN(), 0},
		Clusters: []Cluster{{ID: 1, Name: "c"}},
	}}}
	if err := c.Validate(); !errors.Is(err, ErrInvalidCatalogue) {
		t.Fatalf("Validate = %v", err)
	}
}
