package control

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/strap-llm/strap/internal/jsontext"
	"github.com/strap-llm/strap/internal/resevent"
)

// Resources carries resource events of the session's model (RESOURCES, PROTOCOL.md 1.4);
// the daemon appends them to the resource log the client passed with OPEN.
type Resources struct {
	// Events are JSON objects, each with a string field "event" (docs/RESOURCE_EVENTS.md).
	Events []json.RawMessage `json:"events"`
}

// ResourceLines checks a RESOURCES body and returns its events as JSON lines: each event
// compacted onto one line and ended by '\n', in the order sent, with their count.
//
// The body is validated in one pass (jsontext.Validate: syntax and Unicode) and compacted
// only when it holds white space (clients send compact text); the events are then found by
// walking the compact text, which is cheaper than decoding it (a client sends about a
// hundred events per forward pass of its model). Keys match exactly, after unescaping;
// of a repeated key the last counts, as when decoding into a map.
func ResourceLines(m Message) ([]byte, int, error) {
	compact, err := jsontext.Validate(m.Body)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
	}
	c := m.Body
	if !compact { // clients send compact text; this is the rare case
		var buf bytes.Buffer
		buf.Grow(len(m.Body))
		if err := json.Compact(&buf, m.Body); err != nil {
			return nil, 0, fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
		}
		c = buf.Bytes()
	}
	if c[0] != '{' {
		return nil, 0, fmt.Errorf("%w: %s body is not a JSON object", ErrBadMessage, m.Type)
	}
	events, err := member(c, "events")
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
	}
	if events == nil || string(events) == "null" {
		return nil, 0, fmt.Errorf("%w: %s body lacks required field %q", ErrBadMessage, m.Type, "events")
	}
	if events[0] != '[' {
		return nil, 0, fmt.Errorf("%w: %s events is not a list", ErrBadMessage, m.Type)
	}
	out := make([]byte, 0, len(events)+16)
	n := 0
	for i := 1; events[i] != ']'; {
		end := jsontext.SkipValue(events, i)
		if _, err := resevent.ParseValid(events[i:end]); err != nil {
			return nil, 0, fmt.Errorf("%w: RESOURCES event %d: %w", ErrBadMessage, n, err)
		}
		out = append(append(out, events[i:end]...), '\n')
		n++
		i = end
		if events[i] == ',' {
			i++
		}
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("%w: RESOURCES without events", ErrBadMessage)
	}
	return out, n, nil
}

// member returns the value of key in obj, compact and valid JSON text of an object (nil when
// absent; the last when repeated).
func member(obj []byte, key string) ([]byte, error) {
	var found []byte
	for i := 1; obj[i] != '}'; {
		kend := jsontext.SkipValue(obj, i)
		k := obj[i:kend]
		match := string(k[1:len(k)-1]) == key
		if !match && bytes.IndexByte(k, '\\') >= 0 {
			var s string
			if err := json.Unmarshal(k, &s); err != nil {
				return nil, err
			}
			match = s == key
		}
		vstart := kend + 1 // past ':'
		vend := jsontext.SkipValue(obj, vstart)
		if match {
			found = obj[vstart:vend]
		}
		i = vend
		if obj[i] == ',' {
			i++
		}
	}
	return found, nil
}
