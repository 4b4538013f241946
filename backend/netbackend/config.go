package netbackend

// The inference node's configuration: its listen address, defaults and
// validation.

import (
	"fmt"

	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/node"
)

// DefaultListen is the reference backend's default TCP address.
const DefaultListen = "127.0.0.1:9500"

// NodeConfig configures the reference echo backend node (rtcedge backend).
type NodeConfig struct {
	node.Common `yaml:",inline"`
	Listen      string `yaml:"listen"` // TCP address transceivers connect to; default 127.0.0.1:9500
}

// Defaults fills the unset fields.
func (c *NodeConfig) Defaults() {
	c.Common.Defaults()
	config.Default(&c.Listen, DefaultListen)
}

// Validate checks c after Defaults.
func (c *NodeConfig) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return fmt.Errorf("backend config: %w", err)
	}
	if err := node.CheckHostPort("listen", c.Listen, false); err != nil {
		return fmt.Errorf("backend config: %w", err)
	}
	return nil
}
