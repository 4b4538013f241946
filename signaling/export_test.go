package signaling

import (
	"net/http"
	"time"
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
