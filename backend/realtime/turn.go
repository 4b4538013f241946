package realtime

// The turn: the server's events that start and end a response and detect
// the caller's speech, read for the pod's output (responseID, interrupts),
// and the barge-in that stops a reply (bargeIn) with the events the
// connector sends the server about it, which carry backend.EventIDPrefix so that
// the server's errors about them stay the edge's.

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/backend"
)

// responseID is the response.id of a response event, "" if it has none.
func responseID(data []byte) string {
	var ev struct {
		Response struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &ev) != nil || len(ev.Response.ID) > maxIDLen {
		return "" // a longer one is not the pod's to keep: its deltas are dropped (long_id)
	}
	return ev.Response.ID
}

// interrupts reports whether a session event's turn detection lets the
// caller's speech interrupt a reply: interrupt_response is true unless set
// to false (GA audio.input.turn_detection or beta turn_detection).
func interrupts(data []byte) bool {
	var ev struct {
		Session struct {
			TurnDetection *struct {
				InterruptResponse *bool `json:"interrupt_response"`
			} `json:"turn_detection"`
			Audio struct {
				Input struct {
					TurnDetection *struct {
						InterruptResponse *bool `json:"interrupt_response"`
					} `json:"turn_detection"`
				} `json:"input"`
			} `json:"audio"`
		} `json:"session"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return true
	}
	for _, td := range []*struct {
		InterruptResponse *bool `json:"interrupt_response"`
	}{ev.Session.TurnDetection, ev.Session.Audio.Input.TurnDetection} {
		if td != nil && td.InterruptResponse != nil && !*td.InterruptResponse {
			return false
		}
	}
	return true
}

// ownError reports an error about an event the connector made itself
// (backend.EventIDPrefix: a barge-in's cancel and truncate): the server's
// errors about them (a response the server's VAD cancelled already) are
// not the caller's business.
func ownError(data []byte) bool {
	var ev struct {
		Error struct {
			EventID string `json:"event_id"`
		} `json:"error"`
	}
	return json.Unmarshal(data, &ev) == nil && strings.HasPrefix(ev.Error.EventID, backend.EventIDPrefix)
}

// bargeIn stops the reply: the pod drops what it has queued (the caller
// gets output_audio_buffer.cleared from it), the server gets
// response.cancel for a response in progress and conversation.item.truncate
// with the audio the caller was actually sent, and the cancelled
// response's late deltas are dropped.
func (c *call) bargeIn(source string) {
	var itemID string
	var played time.Duration
	var playing bool
	if c.play != nil {
		itemID, played, playing = c.play.Clear(source)
	}
	c.omu.Lock()
	resp := c.active
	if resp == "" && playing {
		resp = c.curResp // done generating, still playing
	}
	if resp != "" {
		c.cancelled = resp
	}
	c.opcm = c.opcm[:0]
	c.curItem, c.curResp = "", ""
	active := c.active != ""
	c.omu.Unlock()
	if active {
		c.toServer(fmt.Appendf(nil, `{"type":"response.cancel","event_id":"%scancel_%d","response_id":%q}`, backend.EventIDPrefix, c.b.ids.Add(1), resp))
	}
	if playing && itemID != "" {
		c.toServer(fmt.Appendf(nil, `{"type":"conversation.item.truncate","event_id":"%struncate_%d","item_id":%q,"content_index":0,"audio_end_ms":%d}`,
			backend.EventIDPrefix, c.b.ids.Add(1), itemID, played.Milliseconds()))
	}
}
