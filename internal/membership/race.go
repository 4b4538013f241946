//go:build race

package membership

// raceScale stretches the Fast failure-detection timings in binaries built
// with -race (tests only): see fastScale in config.go.
const raceScale = 3
