package geo

import (
	"math"
	"testing"
)

func TestDistanceKm(t *testing.T) {
	fra, iad, sin := Point{50.11, 8.68}, Point{39.04, -77.49}, Point{1.35, 103.82}
	tests := []struct {
		name      string
		a, b      Point
		want, tol float64
	}{
		{"same point", fra, fra, 0, 1e-9},
		{"frankfurt-ashburn", fra, iad, 6530, 30},
		{"frankfurt-singapore", fra, sin, 10260, 40},
		{"quarter meridian", Point{0, 0}, Point{90, 0}, math.Pi / 2 * earthRadiusKm, 1e-6},
		{"antipodes", Point{0, 0}, Point{0, 180}, math.Pi * earthRadiusKm, 1e-6},
		{"symmetric", iad, fra, 6530, 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DistanceKm(tt.a, tt.b); math.Abs(got-tt.want) > tt.tol {
				t.Errorf("DistanceKm = %.3f, want %.3f ± %.3f", got, tt.want, tt.tol)
			}
		})
	}
}
