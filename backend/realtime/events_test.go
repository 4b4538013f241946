package realtime

import "testing"

// TestInterruptResponseFalse: a session whose turn detection says
// interrupt_response false keeps its reply when the caller speaks (the
// connector makes no barge-in of the server's speech_started); any other
// session lets speech interrupt.
func TestInterruptResponseFalse(t *testing.T) {
	for _, c := range []struct {
		ev   string
		want bool
	}{
		{`{"type":"session.updated","session":{"audio":{"input":{"turn_detection":{"type":"server_vad","interrupt_response":false}}}}}`, false},
		{`{"type":"session.updated","session":{"turn_detection":{"type":"server_vad","interrupt_response":false}}}`, false},
		{`{"type":"session.updated","session":{"audio":{"input":{"turn_detection":{"type":"server_vad","interrupt_response":true}}}}}`, true},
		{`{"type":"session.created","session":{"audio":{"input":{"turn_detection":null}}}}`, true},
		{`{"type":"session.created","session":{}}`, true},
	} {
		if got := interrupts([]byte(c.ev)); got != c.want {
			t.Errorf("%s: interrupts %v, want %v", c.ev, got, c.want)
		}
	}
}
