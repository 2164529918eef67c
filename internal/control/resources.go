package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Resources carries resource events of the session's model (RESOURCES, PROTOCOL.md 1.4);
// the daemon appends them to the resource log the client passed with OPEN.
type Resources struct {
	// Events are JSON objects, each with a string field "event" (docs/RESOURCE_EVENTS.md).
	Events []json.RawMessage `json:"events"`
}

// ResourceLines checks a RESOURCES body and returns its events as JSON lines: each event
// compacted onto one line and ended by '\n', in the order sent, with their count.
func ResourceLines(m Message) ([]byte, int, error) {
	var r Resources
	if err := m.Unmarshal(&r, "events"); err != nil {
		return nil, 0, err
	}
	if len(r.Events) == 0 {
		return nil, 0, fmt.Errorf("%w: RESOURCES without events", ErrBadMessage)
	}
	var out bytes.Buffer
	out.Grow(len(m.Body))
	for i, ev := range r.Events {
		if err := checkEvent(ev); err != nil {
			return nil, 0, fmt.Errorf("%w: RESOURCES event %d: %w", ErrBadMessage, i, err)
		}
		if err := json.Compact(&out, ev); err != nil {
			return nil, 0, fmt.Errorf("%w: RESOURCES event %d: %w", ErrBadMessage, i, err)
		}
		out.WriteByte('\n')
	}
	return out.Bytes(), len(r.Events), nil
}

func checkEvent(ev json.RawMessage) error {
	var head struct {
		Event *string `json:"event"`
	}
	if t := bytes.TrimLeft(ev, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return errors.New("not a JSON object")
	}
	if err := json.Unmarshal(ev, &head); err != nil {
		return err
	}
	if head.Event == nil || *head.Event == "" {
		return errors.New(`no "event" name`)
	}
	return nil
}
