package main

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestRunArguments(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		token string
		want  string // substring of the error; "" = flag.ErrHelp
	}{
		{"no subcommand", nil, "x", ""},
		{"unknown subcommand", []string{"apply"}, "x", ""},
		{"missing files", []string{"sync"}, "x", "-config and -catalogue are required"},
		{"missing token", []string{"sync", "-config", "../../cloudflare/testdata/sync.yaml", "-catalogue", "../../geo/testdata/catalogue.yaml"}, "", "CLOUDFLARE_API_TOKEN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envCloudflareToken, tc.token)
			err := run(context.Background(), tc.args)
			if tc.want == "" {
				if !errors.Is(err, flag.ErrHelp) {
					t.Fatalf("run(%q) = %v, want usage", tc.args, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
			}
		})
	}
}
