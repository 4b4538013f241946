package sessionapi

// ICE restart (WHIP, RFC 9725 section 4.4.1) on the internal session API:
//
//	PATCH SessionsPath/{id}  RestartRequest -> 200 RestartResponse, 400/404/412 apierr body
//
// Signaling turns the client's application/trickle-ice-sdpfrag PATCH into
// this JSON and the response back into an SDP fragment with an ETag.

// RestartRequest is the JSON body of PATCH SessionsPath/{id}.
type RestartRequest struct {
	// Fragment is the client's SDP fragment with its new ICE credentials.
	Fragment string `json:"fragment"`
	// IfMatch is the client's If-Match header ("" when absent).
	IfMatch string `json:"if_match,omitempty"`
}

// RestartResponse is the JSON body of a 200 from PATCH SessionsPath/{id}.
type RestartResponse struct {
	// Restarted is false when the fragment carried the credentials already
	// in use (candidates only): nothing changed.
	Restarted bool `json:"restarted"`
	// Fragment is the server's SDP fragment with its new ICE credentials.
	Fragment string `json:"fragment,omitempty"`
	// ETag is the session's entity tag after the request.
	ETag string `json:"etag"`
}
