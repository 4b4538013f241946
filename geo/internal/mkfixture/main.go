// Command mkfixture writes the GeoIP2-City test fixture embedded as
// geo.DevGeoIPDB. Run it through `go generate ./geo`.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/rtcedge/rtcedge/internal/mmdbfixture"
)

func main() {
	out := flag.String("out", "GeoIP2-City-Test.mmdb", "output .mmdb file")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "mkfixture:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	data, err := mmdbfixture.Build(mmdbfixture.Default)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		return fmt.Errorf("write fixture: %w", err)
	}
	return nil
}
