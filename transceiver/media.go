package transceiver

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"unsafe"

	"github.com/pion/dtls/v3"
	"github.com/pion/srtp/v3"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/transceiver/podnet"
)

// The session's side of the pod's media path (podnet.Media): the SRTP keys
// from its DTLS connection, once the PeerConnection is connected.

// errNoMediaPath is returned for a session whose DTLS connection or sender
// is not what the media path needs; the session keeps Pion's path.
var errNoMediaPath = errors.New("transceiver: media path unavailable")

// dtlsConnField is the DTLSTransport field holding the DTLS connection. Pion
// exports no way to the keying material of a PeerConnection's DTLS, so the
// pod reads the field; mediaPathSupported checks it exists with this type
// (TestMediaPathSupported fails if a Pion upgrade renames it), and a
// transceiver built against a Pion without it keeps Pion's media path.
const dtlsConnField = "conn"

// mediaPathSupported reports whether dtlsConnOf can work with this Pion.
func mediaPathSupported() bool {
	f, ok := reflect.TypeFor[webrtc.DTLSTransport]().FieldByName(dtlsConnField)
	return ok && f.Type == reflect.TypeFor[*dtls.Conn]()
}

// dtlsConnOf returns the DTLS connection of a connected transport; the
// caller has checked mediaPathSupported (Transceiver.mediaPath).
func dtlsConnOf(t *webrtc.DTLSTransport) (*dtls.Conn, error) {
	if t == nil {
		return nil, errNoMediaPath
	}
	f := reflect.ValueOf(t).Elem().FieldByName(dtlsConnField)
	c := *(**dtls.Conn)(unsafe.Pointer(f.UnsafeAddr()))
	if c == nil {
		return nil, fmt.Errorf("%w: DTLS not connected", errNoMediaPath)
	}
	return c, nil
}

// startMedia moves the session's media onto the pod's own path. It runs
// once the PeerConnection is connected; until it has run, media goes
// through Pion as before, and when it fails the session keeps Pion's path
// (counted).
func (s *session) startMedia() {
	if !s.t.mediaPath || s.sender == nil || s.media.Load() != nil {
		return
	}
	mp, err := s.newMediaPath()
	if err != nil {
		s.mediaFailed.Store(true)
		s.t.m.mediaPaths.WithLabelValues("pion").Inc()
		s.t.log.Warn("media stays on Pion's path", "session", s.id, "err", err)
		return
	}
	s.outMu.Lock()
	if s.mediaFailed.Load() { // the session is ending (teardown)
		s.outMu.Unlock()
		return
	}
	s.media.Store(mp)
	s.outMu.Unlock()
	mp.Start(maps.Values(s.popByVIP))
	s.t.m.mediaPaths.WithLabelValues("pod").Inc()
}

func (s *session) newMediaPath() (*podnet.Media, error) {
	conn, err := dtlsConnOf(s.pc.SCTP().Transport())
	if err != nil {
		return nil, err
	}
	profile, ok := conn.SelectedSRTPProtectionProfile()
	if !ok {
		return nil, fmt.Errorf("%w: no SRTP profile negotiated", errNoMediaPath)
	}
	state, ok := conn.ConnectionState()
	if !ok {
		return nil, fmt.Errorf("%w: no DTLS state", errNoMediaPath)
	}
	// Our answer's a=setup (s.dtlsClient), not the PeerConnection's local
	// description: reading that takes the PeerConnection's lock and waits
	// for the ICE agent's loop (see onBindingRequest).
	cfg := srtp.Config{Profile: srtp.ProtectionProfile(profile)}
	if err := cfg.ExtractSessionKeysFromDTLS(&state, s.dtlsClient); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoMediaPath, err)
	}
	params := s.sender.GetParameters()
	if len(params.Encodings) == 0 || len(params.Codecs) == 0 {
		return nil, fmt.Errorf("%w: audio sender not negotiated", errNoMediaPath)
	}
	mp, err := s.t.sock.NewMedia(s, s.ufrag, cfg.Keys, cfg.Profile, uint32(params.Encodings[0].SSRC), uint8(params.Codecs[0].PayloadType))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoMediaPath, err)
	}
	return mp, nil
}
