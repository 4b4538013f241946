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
	// webhook decides (an object, the fields a client secret carries).
	Session map[string]any `yaml:"session"`
}

// Defaults fills c's unset fields.
func (c *Config) Defaults() {
	config.Default(&c.MaxDialogs, 10_000)
	config.Default(&c.SourceRate, 20)
	config.Default(&c.SourceBurst, 40)
	config.Default(&c.MaxSources, 100_000)
	config.Default(&c.InviteTimeout, 8*time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
	for i := range c.Trunks {
		t := &c.Trunks[i]
		config.Default(&t.MaxCalls, 100)
		config.Default(&t.CallsPerSecond, 10)
		config.Default(&t.CallBurst, 20)
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
func (t Trunk) password() string {
	if t.DigestPasswordEnv != "" {
		if v := os.Getenv(t.DigestPasswordEnv); v != "" {
			return v
		}
	}
	return t.DigestPassword
}

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
