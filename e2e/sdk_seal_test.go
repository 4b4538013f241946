package e2e

import "github.com/rtcedge/rtcedge/signaling"

// sealedFieldsWin makes the app's key (e2eAPIKey) one whose sealed
// session fields win silently over what a caller sends, the per-credential
// option for SDKs that always send the agent's whole configuration: the
// secrets it mints carry it.
//
// It needs the option itself (signaling.APIKey.SealedFieldsWin), built on
// another branch; until that is merged it sets nothing, and the Agents SDK
// test fails on the refused session.update, as it should.
func sealedFieldsWin(*signaling.Config) {}
