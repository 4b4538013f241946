// Command rtcedge-cloudflare keeps Cloudflare's load balancer for the
// signaling hostname in step with the region catalogue (see docs/deploy.md).
//
// It is a separate binary from rtcedge on purpose: the Cloudflare SDK adds
// about 15 MB to a binary and a few MB of memory to every process that
// carries it, and no relay, pod or signaling front needs it. It runs from a
// deploy pipeline, not on the data path.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cloudflare/cloudflare-go/v6/option"

	"github.com/rtcedge/rtcedge/cloudflare"
	"github.com/rtcedge/rtcedge/geo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "rtcedge-cloudflare: %v\n", err)
		os.Exit(1)
	}
}

// envCloudflareToken carries the API token; it is never read from a file.
const envCloudflareToken = "CLOUDFLARE_API_TOKEN"

// run dispatches `rtcedge-cloudflare <subcommand>`; sync is the only one.
func run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "sync" {
		fmt.Fprintf(os.Stderr, "usage: rtcedge-cloudflare sync -config sync.yaml -catalogue catalogue.yaml [-dry-run]\n")
		return flag.ErrHelp
	}
	fs := flag.NewFlagSet("cloudflare sync", flag.ContinueOnError)
	configPath := fs.String("config", "", "sync config (YAML; see docs/deploy.md)")
	cataloguePath := fs.String("catalogue", "", "region catalogue (YAML; see geo/README.md)")
	dryRun := fs.Bool("dry-run", false, "print the plan and change nothing")
	baseURL := fs.String("api-url", "", "Cloudflare API base URL (default: Cloudflare's production API)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *configPath == "" || *cataloguePath == "" {
		return errors.New("-config and -catalogue are required")
	}
	token := strings.TrimSpace(os.Getenv(envCloudflareToken))
	if token == "" {
		return fmt.Errorf("$%s is not set", envCloudflareToken)
	}
	cfg, err := cloudflare.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	cat, err := geo.LoadCatalogue(*cataloguePath)
	if err != nil {
		return err
	}
	var opts []option.RequestOption
	if *baseURL != "" {
		opts = append(opts, option.WithBaseURL(*baseURL))
	}
	s, err := cloudflare.New(cfg, cat, token, *dryRun, opts...)
	if err != nil {
		return err
	}
	plan, syncErr := s.Sync(ctx)
	if *dryRun {
		fmt.Println("dry run: nothing changed; the plan is")
	}
	// Print what was done even on an error, so a partial sync is visible.
	if err := plan.WritePlan(os.Stdout); err != nil {
		return fmt.Errorf("print plan: %w", err)
	}
	return syncErr
}
