package realtime

// The call's policy: the session configuration the server gets first
// (sendSession), the caller's data-channel events as backend/oaievents
// translates them (Event), and the sideband's events, which pass with the
// app's authority (ServerEvent). Every session.update the server gets is
// shaped here (audio formats forced: the edge transcodes).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/coder/websocket"
	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/oaievents"
)

// sendSession sends the first session.update: the call's config shaped for
// the server, with the audio formats the edge transcodes to.
func (c *call) sendSession(config []byte) error {
	cfg := map[string]any{}
	if len(bytes.TrimSpace(config)) > 0 && !bytes.Equal(bytes.TrimSpace(config), []byte("null")) {
		if err := json.Unmarshal(config, &cfg); err != nil || cfg == nil {
			return fmt.Errorf("realtime: session config is not a JSON object: %v", err)
		}
	}
	ev, err := sessionEvent("", shapeSession(cfg, c.b.cfg.Protocol == ProtocolBeta, c.format))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.b.cfg.DialTimeout)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, ev); err != nil {
		return fmt.Errorf("realtime: send session.update to %s: %w", c.b.host, err)
	}
	c.b.m.eventsTo.Inc()
	return nil
}

// Event implements backend.Handler: a caller's data-channel event,
// translated (backend/oaievents): read strictly, checked against the
// allow-list and the call's policy, re-encoded. The server gets only
// what the translation gives; the caller gets its one error event for a
// refusal (or for the refused part of a session.update).
func (c *call) Event(data []byte) {
	res := c.caller.Translate(data)
	switch res.Action {
	case oaievents.Drop:
		c.b.m.dropped[dropAppendEvent].Inc() // audio comes by media only
		return
	case oaievents.Clear: // WebRTC-only: the edge holds the output buffer
		c.bargeIn(backend.ClearClient)
		return
	case oaievents.Refuse:
		c.b.m.refused.WithLabelValues(res.Reason).Inc()
		c.toCaller(res.Error)
		return
	}
	ev := res.Event
	if res.Session {
		var err error
		if ev, err = c.shapeSession(ev); err != nil {
			c.b.m.refused.WithLabelValues(oaievents.ReasonMalformed).Inc()
			return
		}
	}
	if res.Error != nil {
		c.b.m.refused.WithLabelValues(res.Reason).Inc()
		c.toCaller(res.Error)
	}
	c.toServer(ev)
}

// shapeSession shapes a translated session.update (the pod's own encoding
// of it) for the server: the audio formats forced, GA or beta names.
func (c *call) shapeSession(ev []byte) ([]byte, error) {
	var u struct {
		EventID string         `json:"event_id"`
		Session map[string]any `json:"session"`
	}
	if err := json.Unmarshal(ev, &u); err != nil {
		return nil, fmt.Errorf("realtime: translated session.update: %w", err)
	}
	if u.Session == nil {
		u.Session = map[string]any{}
	}
	return sessionEvent(u.EventID, shapeSession(u.Session, c.b.cfg.Protocol == ProtocolBeta, c.format))
}

// ServerEvent implements backend.ServerEvents: an event from the call's
// sideband (the app server), read strictly and re-encoded by the pod
// (transceiver/sideband.go), goes to the server as it came, never to the
// caller. A session.update passes unfiltered — the caller's policy applies
// to the caller only — shaped for the server (audio formats forced: the
// edge transcodes), and its fields become the call's (so a caller's
// update that "repeats the call's value" repeats the app's latest, not
// what the app replaced). output_audio_buffer.clear clears the edge's
// buffer as the caller's does (output_audio_buffer.cleared then goes to
// the caller and the sidebands: the caller's audio stopped).
func (c *call) ServerEvent(data []byte) {
	var ev struct {
		Type    string         `json:"type"`
		EventID string         `json:"event_id"`
		Session map[string]any `json:"session"`
	}
	_ = json.Unmarshal(data, &ev) // a malformed event goes as it came: the server answers it
	switch ev.Type {
	case "output_audio_buffer.clear":
		c.bargeIn(backend.ClearClient)
		return
	case backend.EventDTMFSend:
		c.sendDTMF(data)
		return
	case "session.update":
		if ev.Session != nil {
			c.caller.Sealed(ev.Session)
			var err error
			if data, err = sessionEvent(ev.EventID, shapeSession(ev.Session, c.b.cfg.Protocol == ProtocolBeta, c.format)); err != nil {
				return
			}
			break
		}
		data = bytes.Clone(data)
	default:
		data = bytes.Clone(data)
	}
	c.toServer(data)
}

func (c *call) toCaller(ev []byte) {
	if c.out.SendEvent(ev) != nil {
		c.b.m.dropped[dropSink].Inc()
		return
	}
	c.b.m.eventsFrom.Inc()
}
