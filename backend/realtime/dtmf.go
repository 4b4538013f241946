// A phone call's keypad digits at the Realtime connector (docs/sip.md,
// "DTMF"). OpenAI's Realtime API tells the app of a SIP caller's key
// press with the server event input_audio_buffer.dtmf_event_received and
// gives the model nothing of it (its client events have no DTMF): the app
// decides what a digit means, over its sideband. The connector does the
// same: the event goes to the call's event consumers, never to the model
// server, and no text stands in for the digit in the conversation. The
// other way, an app's sideband asks for digits with rtcedge's event
// rtcedge.dtmf.send, which the connector hands to the pod, not the server.

package realtime

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/rtcedge/rtcedge/backend"
)

// DTMF implements backend.DTMFHandler.
func (c *call) DTMF(digit byte) {
	c.toCaller(fmt.Appendf(nil, `{"type":%q,"event_id":"%sdtmf_%d","event":%q,"received_at":%d}`,
		backend.EventDTMFReceived, backend.EventIDPrefix, c.b.ids.Add(1), string(digit), time.Now().Unix()))
}

// sendDTMF acts on a sideband's rtcedge.dtmf.send: the pod sends the
// digits to the carrier; a refusal (not digits, too many queued, a call
// that is no phone call or whose carrier takes no DTMF) is answered with
// an error event naming the request's event_id.
func (c *call) sendDTMF(data []byte) {
	var ev struct {
		EventID string `json:"event_id"`
		Digits  string `json:"digits"`
	}
	_ = json.Unmarshal(data, &ev) // a malformed request has no digits: refused below
	err := backend.ErrDTMFUnsupported
	if s, ok := c.out.(backend.DTMFSender); ok {
		err = s.SendDTMF(ev.Digits)
	}
	if err != nil {
		c.toCaller(errorEvent("invalid_request_error", "dtmf_refused", "digits", err.Error(), ev.EventID))
	}
}

var _ backend.DTMFHandler = (*call)(nil)
