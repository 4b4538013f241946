package oaievents

// The allow-list: the event types a caller may send and, for each, the
// fields it may carry (OpenAI Realtime's client events, GA and beta
// names). Everything else is refused. docs/backends.md, "Caller events",
// gives the reasons field by field.

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// kind is the JSON kind a schema node takes.
type kind uint8

const (
	kAny     kind = iota // any value (strictly read and re-encoded)
	kString              // a string, one of enum if set
	kNumber              // a number
	kObject              // an object whose members are fields, no others
	kArray               // an array of elem
	kSession             // a session.update's session: the call's Policy decides each member
)

// field is a member of an object node: its name is kept for the paths of
// refusals, so naming one costs no allocation until something is refused.
type field struct {
	name string
	node *node
}

// node is one value of a schema.
type node struct {
	kind     kind
	fields   map[string]field
	elem     *node
	enum     []string
	nullable bool
}

var (
	anyValue = &node{kind: kAny}
	str      = &node{kind: kString}
	number   = &node{kind: kNumber}
)

func oneOf(v ...string) *node { return &node{kind: kString, enum: v} }
func object(fields map[string]*node) *node {
	n := &node{kind: kObject, fields: make(map[string]field, len(fields))}
	for name, child := range fields {
		n.fields[name] = field{name: name, node: child}
	}
	return n
}
func arrayOf(elem *node) *node { return &node{kind: kArray, elem: elem} }
func nullable(n *node) *node   { c := *n; c.nullable = true; return &c }
func event(typ string, fields map[string]*node) *node {
	fields["type"] = oneOf(typ)
	fields["event_id"] = str
	return object(fields)
}

// modalities are what a response may produce.
var modalities = arrayOf(oneOf("audio", "text"))

// userItem is the only item a caller may create: a user message. System
// and developer messages are the app's instructions; assistant messages
// would put words in the model's mouth; function calls and their outputs
// are the app's tools (it answers them over the sideband).
var userItem = object(map[string]*node{
	"id":     str,
	"object": oneOf("realtime.item"),
	"type":   oneOf("message"),
	"role":   oneOf("user"),
	"status": str,
	"content": arrayOf(object(map[string]*node{
		"type":       oneOf("input_text", "input_audio", "input_image"),
		"text":       str,
		"audio":      str,
		"transcript": str,
		"image_url":  str,
		"detail":     str,
	})),
})

// response is what a caller's response.create may ask of the response:
// how it sounds and how long it runs, never what the model is told
// (instructions, prompt, input), which tools it has, or a response
// outside the conversation (conversation "none"); metadata is the app's
// to tag its own responses with.
var response = object(map[string]*node{
	"conversation":      oneOf("auto"),
	"output_modalities": modalities,
	"modalities":        modalities, // beta
	"max_output_tokens": anyValue,   // a number or "inf"
	"temperature":       number,     // beta
	"voice":             anyValue,   // beta
	"audio": object(map[string]*node{
		"output": object(map[string]*node{"voice": anyValue}),
	}),
})

// events are the event types a caller may send besides session.update
// (its own node), input_audio_buffer.append (dropped: audio comes by
// media) and output_audio_buffer.clear (the pod acts on it).
// conversation.item.delete is not among them: the items a caller could
// delete include the app's own.
var events = map[string]*node{
	"input_audio_buffer.commit": event("input_audio_buffer.commit", map[string]*node{}),
	"input_audio_buffer.clear":  event("input_audio_buffer.clear", map[string]*node{}),
	"conversation.item.create": event("conversation.item.create", map[string]*node{
		"previous_item_id": nullable(str),
		"item":             userItem,
	}),
	"conversation.item.retrieve": event("conversation.item.retrieve", map[string]*node{"item_id": str}),
	"conversation.item.truncate": event("conversation.item.truncate", map[string]*node{
		"item_id": str, "content_index": number, "audio_end_ms": number,
	}),
	"response.create": event("response.create", map[string]*node{"response": response}),
	"response.cancel": event("response.cancel", map[string]*node{"response_id": str}),
}

// sessionUpdate is a caller's session.update.
var sessionUpdate = event("session.update", map[string]*node{"session": {kind: kSession}})

// sessionFields are the schemas of the session fields a caller may set
// where the edge knows their shape (GA's audio: the formats go on only to
// be forced to the edge's, below them nothing else exists); any other
// allowed field takes any value.
var sessionFields = map[string]*node{
	"type": oneOf("realtime"), // a call is a conversation, not a transcription session
	"audio": object(map[string]*node{
		"input": object(map[string]*node{
			"format": anyValue, "noise_reduction": anyValue, "transcription": anyValue, "turn_detection": anyValue,
		}),
		"output": object(map[string]*node{"format": anyValue, "voice": anyValue, "speed": anyValue}),
	}),
}

// walk reads the next value from d against n, writing it to the encoder
// while w.emitting, and appending the path of every refused member or
// value to w.refused (a refusal ends the writing: the event goes nowhere).
// Its error is a malformed event's.
func (w *walker) walk(d *jsontext.Decoder, n *node) error {
	if n == nil {
		n = anyValue
	}
	k := d.PeekKind()
	if k == 'n' && n.nullable {
		return w.copyOrSkip(d)
	}
	switch n.kind {
	case kAny:
		return w.copyOrSkip(d)
	case kString:
		if k != '"' {
			return w.refuseValue(d)
		}
		tok, err := d.ReadToken()
		if err != nil {
			return malformed(err)
		}
		if n.enum != nil && !contains(n.enum, tok.String()) {
			w.refuse()
			return nil
		}
		return w.write(tok)
	case kNumber:
		if k != '0' {
			return w.refuseValue(d)
		}
		return w.copyOrSkip(d)
	case kArray:
		if k != '[' {
			return w.refuseValue(d)
		}
		return w.walkArray(d, n)
	case kObject, kSession:
		if k != '{' {
			return w.refuseValue(d)
		}
		return w.walkObject(d, n)
	}
	return fmt.Errorf("schema: kind %d", n.kind)
}

func (w *walker) walkArray(d *jsontext.Decoder, n *node) error {
	tok, err := d.ReadToken()
	if err != nil {
		return malformed(err)
	}
	if err := w.write(tok); err != nil {
		return err
	}
	for i := 0; d.PeekKind() != ']'; i++ {
		w.path = append(w.path, seg{idx: i})
		err := w.walk(d, n.elem)
		w.path = w.path[:len(w.path)-1]
		if err != nil {
			return err
		}
	}
	if tok, err = d.ReadToken(); err != nil {
		return malformed(err)
	}
	return w.write(tok)
}

func (w *walker) walkObject(d *jsontext.Decoder, n *node) error {
	tok, err := d.ReadToken()
	if err != nil {
		return malformed(err)
	}
	if err := w.write(tok); err != nil {
		return err
	}
	for d.PeekKind() != '}' {
		name, err := d.ReadToken()
		if err != nil {
			return malformed(err)
		}
		if n.kind == kSession {
			member := name.String()
			raw, err := d.ReadValue()
			if err != nil {
				return malformed(err)
			}
			if w.caller.sessionMember(w, member, raw) && w.emitting {
				if err := w.enc.WriteToken(jsontext.String(member)); err != nil {
					return fmt.Errorf("re-encode: %w", err)
				}
				w.subIn = *bytesBuffer(raw)
				w.sub.Reset(&w.subIn)
				if err := w.copyValue(&w.sub); err != nil {
					return err
				}
			}
			continue
		}
		child, ok := n.fields[name.String()]
		if !ok {
			w.refuse(name.String())
			if err := d.SkipValue(); err != nil {
				return malformed(err)
			}
			continue
		}
		w.path = append(w.path, seg{name: child.name})
		if err = w.write(name); err == nil {
			err = w.walk(d, child.node)
		}
		w.path = w.path[:len(w.path)-1]
		if err != nil {
			return err
		}
	}
	if tok, err = d.ReadToken(); err != nil {
		return malformed(err)
	}
	return w.write(tok)
}

// seg is one step of a path: a member's name or an array index.
type seg struct {
	name string // "" for an index
	idx  int
}

// refuse records the value in hand (w.path, then member if not empty) as
// refused.
func (w *walker) refuse(member ...string) {
	var b []byte
	for _, p := range w.path {
		if p.name == "" {
			b = append(strconv.AppendInt(append(b, '['), int64(p.idx), 10), ']')
			continue
		}
		if len(b) > 0 {
			b = append(b, '.')
		}
		b = append(b, p.name...)
	}
	for _, m := range member {
		if len(b) > 0 {
			b = append(b, '.')
		}
		b = append(b, m...)
	}
	w.refused = append(w.refused, string(b))
	w.emitting = false
}

// refuseValue refuses a value of the wrong kind and skips it.
func (w *walker) refuseValue(d *jsontext.Decoder) error {
	w.refuse()
	if err := d.SkipValue(); err != nil {
		return malformed(err)
	}
	return nil
}

func (w *walker) write(tok jsontext.Token) error {
	if !w.emitting {
		return nil
	}
	if err := w.enc.WriteToken(tok); err != nil {
		return fmt.Errorf("re-encode: %w", err)
	}
	return nil
}

func (w *walker) copyOrSkip(d *jsontext.Decoder) error {
	if w.emitting {
		return w.copyValue(d)
	}
	if err := d.SkipValue(); err != nil {
		return malformed(err)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// bytesBuffer is a buffer reading b, for a jsontext.Decoder (which reads
// a *bytes.Buffer in place).
func bytesBuffer(b []byte) *bytes.Buffer { return bytes.NewBuffer(b) }
