package node

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/config"
)

// DefaultDrainTimeout bounds a graceful stop when drain_timeout is unset.
const DefaultDrainTimeout = 5 * time.Minute

// Common holds the settings every role's config file has.
type Common struct {
	LogLevel    string `yaml:"log_level"`    // debug, info, warn, error; default info
	MetricsAddr string `yaml:"metrics_addr"` // /metrics, /livez, /readyz; "" = none
	// DrainTimeout bounds a graceful stop after the first SIGTERM;
	// default 5m.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

// Defaults fills c's unset fields.
func (c *Common) Defaults() {
	config.Default(&c.LogLevel, "info")
	config.Default(&c.DrainTimeout, DefaultDrainTimeout)
}

// Validate checks c after Defaults.
func (c *Common) Validate() error {
	if _, err := c.level(); err != nil {
		return fmt.Errorf("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	if err := NotNegative("drain_timeout", c.DrainTimeout); err != nil {
		return err
	}
	return CheckHostPort("metrics_addr", c.MetricsAddr, true)
}

// Level is c's log level (Validate has checked it).
func (c *Common) Level() slog.Level {
	l, _ := c.level()
	return l
}

func (c *Common) level() (l slog.Level, err error) {
	err = l.UnmarshalText([]byte(strings.ToUpper(c.LogLevel)))
	return l, err
}

// Settings returns c; a role's config embeds Common, so the command that
// loads any of them can reach the common settings.
func (c *Common) Settings() *Common { return c }

// CheckHostPort checks that s is host:port with a numeric port (host may be
// a name, an IP or empty for all addresses); "" is allowed when optional.
func CheckHostPort(what, s string, optional bool) error {
	if s == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("%s is required", what)
	}
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return fmt.Errorf("%s %q: want host:port", what, s)
	}
	return nil
}

// NotNegative returns an error naming what when v is negative (zero
// means the default).
func NotNegative[T int | int64 | float64 | time.Duration](what string, v T) error {
	if v < 0 {
		return fmt.Errorf("%s %v must not be negative", what, v)
	}
	return nil
}
