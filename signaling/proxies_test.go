package signaling

import (
	"net/netip"
	"slices"
	"testing"
)

// TestLegacyTrustedProxiesSplit: an old config that lists Cloudflare's
// ranges and the ingress together in trusted_proxies (as the old docs
// advised) gets the ingress as an internal proxy, never as a source of
// CF-* headers.
func TestLegacyTrustedProxiesSplit(t *testing.T) {
	c := Config{TrustedProxies: []string{"173.245.48.0/20", "2606:4700::/32", "172.64.1.0/24", "10.0.0.0/8", "172.0.0.0/8"},
		CloudflareRanges: []string{"127.0.0.0/8"}, InternalProxies: []string{"192.168.0.0/16"}}
	cf, internal, err := c.proxies()
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	wantCF := []netip.Prefix{p("127.0.0.0/8"), p("173.245.48.0/20"), p("2606:4700::/32"), p("172.64.1.0/24")}
	wantInternal := []netip.Prefix{p("192.168.0.0/16"), p("10.0.0.0/8"), p("172.0.0.0/8")}
	if !slices.Equal(cf, wantCF) || !slices.Equal(internal, wantInternal) {
		t.Fatalf("cloudflare %v internal %v\nwant %v and %v", cf, internal, wantCF, wantInternal)
	}
}
