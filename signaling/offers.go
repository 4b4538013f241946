package signaling

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"os"

	"github.com/rtcedge/rtcedge/internal/apierr"
)

// readBody reads a request body under the size cap. A body that stalls
// until the server's read timeout gets 408; the connection is closed.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body over %d bytes", s.cfg.MaxBody), 0)
		return nil, false
	}
	// A declared length over the cap is refused before reading a byte.
	if r.ContentLength > s.cfg.MaxBody {
		w.Header().Set("Connection", "close")
		return tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err == nil {
		return body, true
	}
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		return tooLarge()
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		s.m.readTimeouts.Inc()
		w.Header().Set("Connection", "close")
		apierr.Write(w, http.StatusRequestTimeout, apierr.TypeInvalidRequest, "request_timeout",
			"the request body did not arrive in time", 0)
	default:
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "unreadable_body", "could not read the request body", 0)
	}
	return nil, false
}

func unsupportedMediaType(w http.ResponseWriter, msg string) {
	apierr.Write(w, http.StatusUnsupportedMediaType, apierr.TypeInvalidRequest, "unsupported_media_type", msg, 0)
}

// Where the calls of each endpoint live: /v1/realtime/sdp has always
// answered a session URL; /v1/realtime/calls answers OpenAI's call URL.
const (
	sessionsLocation = "/v1/realtime/sessions/"
	callsLocation    = "/v1/realtime/calls/"
)

func (s *Server) handleSDP(w http.ResponseWriter, r *http.Request) {
	loc, cred, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/sdp" {
		unsupportedMediaType(w, "the offer must be sent as Content-Type: application/sdp")
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	s.placeCall(w, r, call{loc: loc, cred: cred, offer: string(body), location: sessionsLocation})
}

func (s *Server) handleCalls(w http.ResponseWriter, r *http.Request) {
	loc, cred, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "application/sdp":
		body, ok := s.readBody(w, r)
		if !ok {
			return
		}
		s.placeCall(w, r, call{loc: loc, cred: cred, offer: string(body), location: callsLocation})
	case "multipart/form-data":
		offer, session, ok := s.readMultipart(w, r, params["boundary"])
		if !ok {
			return
		}
		s.placeCall(w, r, call{loc: loc, cred: cred, offer: offer, session: session, location: callsLocation})
	default:
		unsupportedMediaType(w, "send the offer as application/sdp, or multipart/form-data with sdp and session fields")
	}
}

// readMultipart reads the "sdp" and optional "session" (a JSON object)
// fields of an OpenAI-style multipart offer. Either may be a plain field or
// a file part (curl -F sdp=@offer.sdp); other parts are ignored. The body
// is read under the size cap first, so parsing never touches the disk.
func (s *Server) readMultipart(w http.ResponseWriter, r *http.Request, boundary string) (string, json.RawMessage, bool) {
	body, ok := s.readBody(w, r)
	if !ok {
		return "", nil, false
	}
	badParam := func(msg, param string) (string, json.RawMessage, bool) {
		if param == "" {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_multipart", msg, 0)
		} else {
			apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_multipart", msg, param)
		}
		return "", nil, false
	}
	bad := func(msg string) (string, json.RawMessage, bool) { return badParam(msg, "") }
	if boundary == "" {
		return bad("multipart body without a boundary parameter")
	}
	var offers, sessions [][]byte
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		part, err := mr.NextPart()
		if err == io.EOF { // the closing boundary: a well-formed end
			break
		}
		if err != nil {
			return bad("multipart body does not parse: " + err.Error())
		}
		data, err := io.ReadAll(part)
		if err != nil {
			return bad("multipart part does not parse: " + err.Error())
		}
		switch part.FormName() {
		case "sdp":
			offers = append(offers, data)
		case "session":
			sessions = append(sessions, data)
		}
	}
	if len(offers) != 1 {
		return badParam(fmt.Sprintf("multipart body needs exactly one sdp field, has %d", len(offers)), "sdp")
	}
	var session json.RawMessage
	switch len(sessions) {
	case 0:
	case 1:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(sessions[0], &obj); err != nil || obj == nil {
			return badParam("the session field must be a JSON object", "session")
		}
		session = json.RawMessage(sessions[0])
	default:
		return badParam("multipart body has more than one session field", "session")
	}
	return string(offers[0]), session, true
}
