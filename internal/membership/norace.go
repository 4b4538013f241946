//go:build !race

package membership

// raceScale is 1 outside -race builds: see fastScale in config.go.
const raceScale = 1
