// The SIP front's config: its listeners, limits and trunks.

package sipfront

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/placement"
)

// Config is the SIP front's part of its config file (docs/sip.md); the
// fields tagged yaml:"-" are set by the node (or a test), never by the
// file. The caller owns it; New takes a copy.
type Config struct {
	// ContactHost is the host of the Contact header of answers (the name
	// or address carriers reach this front at); default the address the
	// INVITE came in on.
	ContactHost string `yaml:"contact_host"`
	// MaxDialogs bounds the live calls of this replica; default 10000.
	MaxDialogs int `yaml:"max_dialogs"`
	// SourceRate and SourceBurst limit the SIP requests of each source
	// address (IPv4, or IPv6 /64); past them a request is dropped
	// unanswered and counted. Default 20/s, burst 40. MaxSources bounds
	// the table of limiters; default 100000.
	SourceRate  float64 `yaml:"source_rate"`
	SourceBurst int     `yaml:"source_burst"`
	MaxSources  int     `yaml:"max_sources"`
	// InviteTimeout bounds an INVITE from its arrival to the final answer;
	// default 8s (below a carrier's timer C).
	InviteTimeout time.Duration `yaml:"invite_timeout"`
	// Trunks are the carriers allowed to place calls.
	Trunks []Trunk `yaml:"trunks"`

	// Call control (docs/sip.md, "Call control"): with a webhook URL
	// (here for every trunk, or a trunk's own), an admitted INVITE rings
	// (180), the front POSTs a signed realtime.call.incoming event there,
	// and the call waits for /accept, /reject or AcceptTimeout.
	WebhookURL string `yaml:"webhook_url"`
	// WebhookSecret (better: the environment variable WebhookSecretEnv
	// names) is the Standard Webhooks signing secret, "whsec_" and the
	// base64 of at least 24 random bytes.
	WebhookSecret    string `yaml:"webhook_secret"`
	WebhookSecretEnv string `yaml:"webhook_secret_env"`
	// WebhookTimeout bounds one delivery, its retries included (connect
	// to the end of the last answer); default 5s, at most AcceptTimeout.
	WebhookTimeout time.Duration `yaml:"webhook_timeout"`
	// WebhookAllowPrivate lets webhooks reach loopback, private and
	// link-local addresses (the dev world, tests); default false: a URL
	// that resolves there is refused at connect time.
	WebhookAllowPrivate bool `yaml:"webhook_allow_private"`
	// AcceptTimeout is how long a ringing call waits for its decision;
	// past it the call is refused 480 and everything it held is freed.
	// Default 20s (below RFC 3261's 1xx refresh of a minute and a
	// carrier's timer C).
	AcceptTimeout time.Duration `yaml:"accept_timeout"`
	// APIKeys are the credentials of /v1/realtime/calls/{call_id}/...
	// (the front serves them on api_addr); a key sees only the calls of
	// trunks of its tenant.
	APIKeys []APIKey `yaml:"api_keys"`
	// ClientSessionFields and SealedFieldsWin are the default caller
	// policy of an accept's session over the trunk's (as signaling's keys
	// of the same names; default sessionapi.DefaultClientSessionFields,
	// false). An API key's own policy wins.
	ClientSessionFields []string `yaml:"client_session_fields"`
	SealedFieldsWin     bool     `yaml:"sealed_fields_win"`
	// Replica is this replica's name among the fronts serving the same
	// applications (e.g. the StatefulSet pod's name); its call_ids carry
	// it. APIPeers are the other replicas' call-control base URLs by
	// name: a decision for a peer's call is forwarded there. Both empty:
	// one replica.
	Replica  string            `yaml:"replica"`
	APIPeers map[string]string `yaml:"api_peers"`

	Now func() time.Time `yaml:"-"` // default time.Now
}

// Trunk is one carrier trunk.
type Trunk struct {
	Name string `yaml:"name"`
	// SourceCIDRs are the carrier's signaling addresses; a request from
	// elsewhere is not this trunk's.
	SourceCIDRs []string `yaml:"source_cidrs"`
	// MediaCIDRs are where the carrier's media may be (the SDP's
	// connection address); default SourceCIDRs.
	MediaCIDRs []string `yaml:"media_cidrs"`
	// DigestUser and the password (DigestPassword, or better the
	// environment variable DigestPasswordEnv names) make INVITEs prove
	// the trunk's credentials (RFC 3261 digest); empty: addresses only.
	DigestUser        string `yaml:"digest_user"`
	DigestPassword    string `yaml:"digest_password"`
	DigestPasswordEnv string `yaml:"digest_password_env"`
	// MaxCalls bounds the trunk's live calls on this replica; default 100.
	MaxCalls int `yaml:"max_calls"`
	// CallsPerSecond and CallBurst limit the trunk's new calls; default
	// 10/s, burst 20.
	CallsPerSecond float64 `yaml:"calls_per_second"`
	CallBurst      int     `yaml:"call_burst"`
	// POP pins the trunk's calls to a POP by name; "": chosen as for
	// WebRTC from the carrier's signaling address.
	POP string `yaml:"pop"`
	// Session is the session config every call of the trunk gets while no
	// webhook decides (an object, the fields a client secret carries);
	// with a webhook, the sealed part an accept's session is merged under.
	Session map[string]any `yaml:"session"`
	// Tenant owns the trunk's calls: only API keys of this tenant may
	// accept, reject, refer or hang them up. Default "default".
	Tenant string `yaml:"tenant"`
	// WebhookURL, WebhookSecret and WebhookSecretEnv override the
	// front's for this trunk's calls.
	WebhookURL       string `yaml:"webhook_url"`
	WebhookSecret    string `yaml:"webhook_secret"`
	WebhookSecretEnv string `yaml:"webhook_secret_env"`
}

// APIKey is a credential of the call-control API.
type APIKey struct {
	// Key (better: the environment variable KeyEnv names) is the bearer
	// token, at least 16 characters.
	Key    string `yaml:"key"`
	KeyEnv string `yaml:"key_env"`
	// Tenant is the tenant whose calls the key controls; default
	// "default".
	Tenant string `yaml:"tenant"`
	// ClientSessionFields and SealedFieldsWin are the key's own caller
	// policy for its accepts (nil: the front's).
	ClientSessionFields []string `yaml:"client_session_fields"`
	SealedFieldsWin     *bool    `yaml:"sealed_fields_win"`
}

// DefaultTenant is the tenant of trunks and keys that name none.
const DefaultTenant = "default"

// key is the key's bearer token: from the environment when KeyEnv names
// a set variable, else Key.
func (k APIKey) key() string { return fromEnv(k.KeyEnv, k.Key) }

// fromEnv is the value of the environment variable env when it is set,
// else def.
func fromEnv(env, def string) string {
	if env != "" {
		if v := os.Getenv(env); v != "" {
			return v
		}
	}
	return def
}

// Defaults fills c's unset fields.
func (c *Config) Defaults() {
	config.Default(&c.MaxDialogs, 10_000)
	config.Default(&c.SourceRate, 20)
	config.Default(&c.SourceBurst, 40)
	config.Default(&c.MaxSources, 100_000)
	config.Default(&c.InviteTimeout, 8*time.Second)
	config.Default(&c.AcceptTimeout, 20*time.Second)
	config.Default(&c.WebhookTimeout, 5*time.Second)
	c.WebhookTimeout = min(c.WebhookTimeout, c.AcceptTimeout)
	if c.ClientSessionFields == nil {
		c.ClientSessionFields = sessionapi.DefaultClientSessionFields
	}
	for i := range c.APIKeys {
		config.Default(&c.APIKeys[i].Tenant, DefaultTenant)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	for i := range c.Trunks {
		t := &c.Trunks[i]
		config.Default(&t.MaxCalls, 100)
		config.Default(&t.CallsPerSecond, 10)
		config.Default(&t.CallBurst, 20)
		config.Default(&t.Tenant, DefaultTenant)
		if len(t.MediaCIDRs) == 0 {
			t.MediaCIDRs = t.SourceCIDRs
		}
	}
}

// Validate reports every problem of c (after Defaults) at once.
func (c *Config) Validate() error {
	var errs []error
	if c.MaxDialogs <= 0 || c.SourceRate <= 0 || c.SourceBurst <= 0 || c.MaxSources <= 0 || c.InviteTimeout <= 0 {
		errs = append(errs, errors.New("max_dialogs, source_rate, source_burst, max_sources and invite_timeout must be positive"))
	}
	if len(c.Trunks) == 0 {
		errs = append(errs, errors.New("at least one trunk is required"))
	}
	errs = append(errs, c.validateControl(), c.validatePeers())
	names := map[string]bool{}
	for i, t := range c.Trunks {
		if err := t.validate(); err != nil {
			errs = append(errs, fmt.Errorf("trunks[%d]: %w", i, err))
		}
		if names[t.Name] {
			errs = append(errs, fmt.Errorf("trunks[%d]: name %q is used twice", i, t.Name))
		}
		names[t.Name] = true
	}
	return errors.Join(errs...)
}

// hasWebhook reports whether any trunk's calls are decided by a webhook.
func (c *Config) hasWebhook() bool {
	if c.WebhookURL != "" {
		return true
	}
	for _, t := range c.Trunks {
		if t.WebhookURL != "" {
			return true
		}
	}
	return false
}

func (t Trunk) validate() error {
	var errs []error
	if t.Name == "" {
		errs = append(errs, errors.New("name is required"))
	}
	if len(t.SourceCIDRs) == 0 {
		errs = append(errs, errors.New("source_cidrs is required"))
	}
	for _, s := range append(append([]string{}, t.SourceCIDRs...), t.MediaCIDRs...) {
		if _, err := netip.ParsePrefix(s); err != nil {
			errs = append(errs, fmt.Errorf("CIDR %q: %w", s, err))
		}
	}
	if (t.DigestUser == "") != (t.password() == "") {
		errs = append(errs, errors.New("digest_user and a digest password (digest_password or digest_password_env) go together"))
	}
	if t.MaxCalls <= 0 || t.CallsPerSecond <= 0 || t.CallBurst <= 0 {
		errs = append(errs, errors.New("max_calls, calls_per_second and call_burst must be positive"))
	}
	if _, err := t.session(); err != nil {
		errs = append(errs, fmt.Errorf("session: %w", err))
	}
	return errors.Join(errs...)
}

// password is the trunk's digest password: from the environment when
// DigestPasswordEnv names a set variable, else DigestPassword.
func (t Trunk) password() string { return fromEnv(t.DigestPasswordEnv, t.DigestPassword) }

// session is the trunk's session config as canonical JSON (nil when empty).
func (t Trunk) session() (json.RawMessage, error) {
	if len(t.Session) == 0 {
		return nil, nil
	}
	raw, err := json.Marshal(t.Session)
	if err != nil {
		return nil, err
	}
	return placement.CanonicalSession(raw)
}
