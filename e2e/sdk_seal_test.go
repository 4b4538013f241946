package e2e

// The credential option the Agents SDK test runs with.

import "github.com/rtcedge/rtcedge/signaling"

// sealedFieldsWin makes the app's key (e2eAPIKey) one whose sealed
// session fields win silently over what a caller sends
// (APIKey.SealedFieldsWin), the per-credential option for SDKs that always
// send the agent's whole configuration: the secrets it mints carry it.
func sealedFieldsWin(c *signaling.Config) {
	yes := true
	c.APIKeys, c.Keys = nil, []signaling.APIKey{{Key: e2eAPIKey, SealedFieldsWin: &yes}}
}
