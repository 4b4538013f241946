package signaling

import (
	"net/http"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// WithReadTimeouts replaces the header and whole-request read timeouts;
// zero keeps a default. Tests shorten them to watch a stalled client being
// cut off.
func WithReadTimeouts(header, request time.Duration) HTTPOption {
	return func(s *http.Server) {
		if header > 0 {
			s.ReadHeaderTimeout = header
		}
		if request > 0 {
			s.ReadTimeout = request
		}
	}
}

// SessionOf returns the session ID inside a call ID (the last segment of a
// call's Location), which names the call's cluster and pod. It does not
// check the call ID's capability.
func SessionOf(callID string) (sessionid.ID, error) {
	session, _, _ := strings.Cut(callID, ".")
	return sessionid.Parse(session)
}
