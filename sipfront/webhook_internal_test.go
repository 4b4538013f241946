package sipfront

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// The Standard Webhooks specification's published vector: a receiver's
// library verifies what the front signs only if this matches exactly.
func TestSignWebhookVector(t *testing.T) {
	key, err := webhookKey("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	got := signWebhook(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
	for _, bad := range []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_***", "whsec_c2hvcnQ="} {
		if _, err := webhookKey(bad); err == nil {
			t.Errorf("secret %q accepted", bad)
		}
	}
}

func TestInternalAddr(t *testing.T) {
	for a, want := range map[string]bool{
		"127.0.0.1": true, "10.1.2.3": true, "192.168.0.1": true, "172.16.0.1": true, "169.254.169.254": true,
		"100.64.0.1": true, "0.0.0.0": true, "::1": true, "fe80::1": true, "fd00::1": true, "::ffff:127.0.0.1": true,
		"203.0.113.9": false, "8.8.8.8": false, "2001:db8::1": false,
	} {
		if got := internalAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("internalAddr(%s) = %v, want %v", a, got, want)
		}
	}
}

func TestCheckTarget(t *testing.T) {
	for target, ok := range map[string]bool{
		"sip:desk@example.com": true, "sips:+15551234567@pbx.example.com;user=phone": true, "tel:+15551234567": true,
		"": false, "http://example.com": false, "sip:a@b>": false, "sip:a@b\r\nX: y": false, "tel:": false,
		"sip:" + strings.Repeat("a", 600) + "@b": false, "sip:a b@c": false,
	} {
		if err := checkTarget(target); (err == nil) != ok {
			t.Errorf("checkTarget(%q) = %v, want ok %v", target, err, ok)
		}
	}
}

func TestSipfragStatus(t *testing.T) {
	for body, want := range map[string]int{
		"SIP/2.0 200 OK\r\n": 200, "SIP/2.0 100 Trying": 100, "SIP/2.0 486 Busy Here\r\nContent-Length: 0\r\n": 486,
		"": 0, "HTTP/1.1 200 OK": 0, "SIP/2.0 abc": 0, "SIP/2.0 99 x": 0, "SIP/2.0 700 x": 0,
	} {
		if got, ok := sipfragStatus([]byte(body)); got != want || ok != (want != 0) {
			t.Errorf("sipfragStatus(%q) = %d, %v; want %d", body, got, ok, want)
		}
	}
}

func TestControlConfig(t *testing.T) {
	base := func() Config {
		return Config{WebhookURL: "https://app.example.com/hook", WebhookSecret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
			APIKeys: []APIKey{{Key: "sk-0123456789abcdef"}}, Trunks: []Trunk{{Name: "t", SourceCIDRs: []string{"203.0.113.0/24"}}}}
	}
	ok := base()
	ok.Defaults()
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"bad secret": {func(c *Config) { c.WebhookSecret = "secret" }, "whsec_"},
		"no keys":    {func(c *Config) { c.APIKeys = nil }, "needs api_keys"},
		"short key":  {func(c *Config) { c.APIKeys[0].Key = "short" }, "at least 16"},
		"bad URL":    {func(c *Config) { c.WebhookURL = "ftp://x" }, "not an http(s) URL"},
		"trunk URL": {func(c *Config) {
			c.WebhookURL = ""
			c.Trunks[0].WebhookURL = "https://a.example.com"
			c.WebhookSecret = ""
		}, "whsec_"},
		"long accept":          {func(c *Config) { c.AcceptTimeout = 2 * time.Minute }, "accept_timeout is over"},
		"peers without a name": {func(c *Config) { c.APIPeers = map[string]string{"b": "http://b:8443"} }, "needs replica"},
		"bad peer URL":         {func(c *Config) { c.Replica = "a"; c.APIPeers = map[string]string{"b": "b:8443/x"} }, "base URL"},
		"bad replica":          {func(c *Config) { c.Replica = "A_1" }, "lower-case"},
		"twice a key":          {func(c *Config) { c.APIKeys = append(c.APIKeys, c.APIKeys[0]) }, "used twice"},
	} {
		c := base()
		tc.edit(&c)
		c.Defaults()
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}

func TestNodeNeedsAPIAddrWithAWebhook(t *testing.T) {
	c := NodeConfig{SIPUDP: "127.0.0.1:0", Catalogue: "catalogue.yaml", Config: Config{WebhookURL: "https://app.example.com/hook",
		WebhookSecret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", APIKeys: []APIKey{{Key: "sk-0123456789abcdef"}},
		Trunks: []Trunk{{Name: "t", SourceCIDRs: []string{"203.0.113.0/24"}}}}}
	c.Defaults()
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "needs api_addr") {
		t.Fatalf("no api_addr: %v", err)
	}
	c.APIAddr = "127.0.0.1:0"
	if err := c.Validate(); err != nil {
		t.Fatalf("with api_addr: %v", err)
	}
}
