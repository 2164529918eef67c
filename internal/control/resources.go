package control

import (
	"bytes"
	"encoding/json"
	"errors"
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
	// One walk of the body's members; the "events" array is read where it lies (each event
	// parsed once, its end found by the parse), and of a repeated "events" the last counts.
	var (
		out    = make([]byte, 0, len(c)) // one "events" member's lines fit
		n      int
		found  bool  // an "events" member
		events error // what is wrong with the last one
	)
	for i := 1; c[i] != '}'; {
		kend := jsontext.SkipString(c, i)
		match, err := isKey(c[i:kend], "events")
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
		}
		vstart := kend + 1 // past ':'
		var vend int
		if match {
			found = true
			out, n, vend, events = eventLines(c, vstart, out[:0])
		} else {
			vend = jsontext.SkipValue(c, vstart)
		}
		i = vend
		if c[i] == ',' {
			i++
		}
	}
	switch {
	case !found:
		return nil, 0, fmt.Errorf("%w: %s body lacks required field %q", ErrBadMessage, m.Type, "events")
	case events != nil:
		return nil, 0, fmt.Errorf("%w: %s %w", ErrBadMessage, m.Type, events)
	case n == 0:
		return nil, 0, fmt.Errorf("%w: RESOURCES without events", ErrBadMessage)
	}
	return out, n, nil
}

// isKey says whether the string token k (compact, valid) names key, after unescaping.
func isKey(k []byte, key string) (bool, error) {
	if string(k[1:len(k)-1]) == key {
		return true, nil
	}
	if bytes.IndexByte(k, '\\') < 0 {
		return false, nil
	}
	var s string
	if err := json.Unmarshal(k, &s); err != nil {
		return false, err
	}
	return s == key, nil
}

// eventLines appends the events of the "events" value at c[i] (compact, valid text) to out
// as JSON lines and returns them, their count and the value's end; err says what is wrong
// with the value (null, not a list, an event that is not one), and then the end is found by
// skipping it.
func eventLines(c []byte, i int, out []byte) (_ []byte, n, end int, err error) {
	switch c[i] {
	case 'n': // null: as if absent
		return out, 0, i + 4, fmt.Errorf("body lacks required field %q", "events")
	case '[':
	default:
		return out, 0, jsontext.SkipValue(c, i), errors.New("events is not a list")
	}
	for j := i + 1; ; {
		if c[j] == ']' {
			return out, n, j + 1, nil
		}
		_, size, err := resevent.ParseValidAt(c[j:])
		if err != nil {
			return out, 0, jsontext.SkipValue(c, i), fmt.Errorf("event %d: %w", n, err)
		}
		out = append(append(out, c[j:j+size]...), '\n')
		n++
		if j += size; c[j] == ',' {
			j++
		}
	}
}
