package oaievents

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzTranslate: whatever a caller sends, the pod does not fail, and what
// it forwards is its own encoding of an allowed event: translating it
// again gives the same bytes, and no member any parser could read as an
// override (in any case), no item but a user message is in it.
func FuzzTranslate(f *testing.F) {
	for _, tc := range hostile {
		f.Add([]byte(tc.event))
	}
	for _, ev := range benign {
		f.Add([]byte(ev))
	}
	f.Add([]byte(`{"type":"session.update","session":{"voice":"ash","instructions":"x","audio":{"output":{"voice":"ash"}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, p := range []Policy{{}, {SealedWins: true}} {
			c := NewCaller(p, []byte(`{"instructions":"SEALED"}`))
			res := c.Translate(data)
			switch res.Action {
			case Refuse:
				if res.Event != nil || res.Error == nil {
					t.Fatalf("refusal with an event or without an error: %+v", res)
				}
				continue
			case Drop, Clear:
				continue
			}
			if err := Check(res.Event); err != nil {
				t.Fatalf("forwarded %s, which does not read strictly: %v", res.Event, err)
			}
			again := c.Translate(res.Event)
			if again.Action != Forward || again.Error != nil || !bytes.Equal(again.Event, res.Event) {
				t.Fatalf("%s forwarded as %s, which translates to %+v", data, res.Event, again)
			}
			var v any
			if err := json.Unmarshal(res.Event, &v); err != nil {
				t.Fatalf("forwarded %s: %v", res.Event, err)
			}
			if bad := override(v); bad != "" {
				t.Fatalf("%s forwarded as %s with %s", data, res.Event, bad)
			}
		}
	})
}

// override names a member of v that overrides what the app sealed, or an
// item that only the app may create; "" if none.
func override(v any) string {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			switch strings.ToLower(k) {
			case "instructions", "tools", "tool_choice", "prompt", "model", "metadata", "tracing":
				return "member " + k
			case "input": // a response's input items (audio.input is the session's audio)
				if _, items := x.([]any); items {
					return "member " + k
				}
			case "role":
				if x != "user" {
					return "role " + k
				}
			case "type":
				if s, _ := x.(string); strings.HasPrefix(s, "function_call") {
					return "item type " + s
				}
			case "conversation":
				if x != "auto" {
					return "conversation " + k
				}
			}
			if bad := override(x); bad != "" {
				return bad
			}
		}
	case []any:
		for _, x := range v {
			if bad := override(x); bad != "" {
				return bad
			}
		}
	}
	return ""
}

func jsonValid(b []byte) bool { return json.Valid(b) }
