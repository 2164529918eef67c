package resevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/strap-llm/strap/internal/jsontext"
)

// ErrNotEvent is wrapped by Parse's errors: the bytes are not one resource event.
var ErrNotEvent = errors.New("not a resource event")

// Event is one resource event with its common fields located, not yet decoded: each
// accessor decodes its field and applies that field's rule, so a consumer pays for, and
// fails on, only the fields it reads. Keys match exactly (after unescaping); of a repeated
// key the last counts, as when decoding into a map.
type Event struct {
	name, component, layerID, layer, timestamp, durationUS, flops []byte // raw JSON values; nil when absent
}

// Parse reads one event: exactly one JSON object (whitespace around it allowed) whose
// "event" member is a non-empty string. Its other members may be anything; the common
// ones are checked by their accessors.
func Parse(line []byte) (Event, error) {
	b := bytes.TrimSpace(line)
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		return Event{}, fmt.Errorf("%w: invalid JSON: %v", ErrNotEvent, err)
	}
	return ParseValid(b)
}

// ParseValid is Parse for bytes already known to be one valid JSON value with no space
// around it (a value of the text json.Compact wrote: control's RESOURCES body), without
// Parse's second validity scan. On other bytes it never panics, but what it returns is
// meaningless; FuzzParse holds it equal to Parse on valid input.
func ParseValid(b []byte) (Event, error) {
	e, _, err := ParseValidAt(b)
	return e, err
}

// ParseValidAt is ParseValid for the object starting at b[0] of valid JSON text that may go
// on after it (an array of events): it also returns the index just past the object, so a
// caller walking the array need not skip each event before reading it.
func ParseValidAt(b []byte) (Event, int, error) {
	if len(b) == 0 || b[0] != '{' {
		return Event{}, 0, fmt.Errorf("%w: not a JSON object", ErrNotEvent)
	}
	var e Event
	end := 0
	for i := 1; ; {
		if i = jsontext.SkipSpace(b, i); i >= len(b) {
			return Event{}, 0, fmt.Errorf("%w: truncated object", ErrNotEvent)
		}
		if b[i] == '}' {
			end = i + 1
			break
		}
		kend := jsontext.SkipString(b, i)
		key := b[i:kend]
		i = jsontext.SkipSpace(b, kend) + 1 // past ':'
		i = jsontext.SkipSpace(b, i)
		if i >= len(b) || len(key) < 2 {
			return Event{}, 0, fmt.Errorf("%w: truncated object", ErrNotEvent)
		}
		vend := jsontext.SkipValue(b, i)
		val := b[i:vend]
		if p := e.slot(key); p != nil {
			*p = val
		}
		if i = jsontext.SkipSpace(b, vend); i < len(b) && b[i] == ',' {
			i++
		}
	}
	// A string token longer than its quotes is a non-empty string, unless escapes hide
	// that (then decode it: rare, and allowed to cost).
	if len(e.name) < 3 || e.name[0] != '"' || (bytes.IndexByte(e.name, '\\') >= 0 && keyName(e.name) == "") {
		return Event{}, 0, fmt.Errorf(`%w: no "event" name`, ErrNotEvent)
	}
	return e, end, nil
}

// Name is the "event" member: a non-empty string (Parse refuses an event without one).
func (e *Event) Name() string { return keyName(e.name) }

// Component is component_type; ok is false when it is absent or null.
func (e *Event) Component() (s string, ok bool, err error) {
	if isNull(e.component) {
		return "", false, nil
	}
	if err := json.Unmarshal(e.component, &s); err != nil {
		return "", false, fmt.Errorf("component_type: want a string, got %.40s", e.component)
	}
	return s, true, nil
}

// Layer is layer_id or, on an event without one (absent or null), layer: a string, or a
// number as written; ok is false when neither is there.
func (e *Event) Layer() (s string, ok bool, err error) {
	for _, f := range []struct {
		name string
		raw  []byte
	}{{"layer_id", e.layerID}, {"layer", e.layer}} {
		if isNull(f.raw) {
			continue
		}
		if f.raw[0] == '"' {
			if err := json.Unmarshal(f.raw, &s); err != nil {
				return "", false, fmt.Errorf("%s: %w", f.name, err)
			}
			return s, true, nil
		}
		var n json.Number
		if err := json.Unmarshal(f.raw, &n); err != nil {
			return "", false, fmt.Errorf("%s: want a string or a number, got %.40s", f.name, f.raw)
		}
		return n.String(), true, nil
	}
	return "", false, nil
}

// TimestampUS is timestamp in Unix microseconds: a JSON integer as the resource monitor
// writes it, or a string of decimal digits (seed 003's logs quoted it); ok is false when it
// is absent or null.
func (e *Event) TimestampUS() (us int64, ok bool, err error) {
	if isNull(e.timestamp) {
		return 0, false, nil
	}
	digits := string(e.timestamp)
	var s string
	if json.Unmarshal(e.timestamp, &s) == nil {
		digits = s
	}
	us, perr := strconv.ParseInt(digits, 10, 64)
	if perr != nil || us < 0 {
		return 0, false, fmt.Errorf("timestamp: want Unix microseconds (an integer, or a string of digits), got %.40s", e.timestamp)
	}
	return us, true, nil
}

// DurationUS is duration_us: a finite non-negative number; ok is false when it is absent
// or null.
func (e *Event) DurationUS() (v float64, ok bool, err error) {
	return figure("duration_us", e.durationUS)
}

// FLOPs is flops: a finite non-negative number; ok is false when it is absent or null (the
// client writes null where it cannot compute them).
func (e *Event) FLOPs() (v float64, ok bool, err error) {
	return figure("flops", e.flops)
}

func figure(name string, raw []byte) (v float64, ok bool, err error) {
	if isNull(raw) {
		return 0, false, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false, fmt.Errorf("%s: want a finite non-negative number, got %.40s", name, raw)
	}
	return v, true, nil
}

func isNull(raw []byte) bool { return raw == nil || string(raw) == "null" }

// slot is where the value of the member with key tok goes, nil for a
// member that is not a common field. Matched without allocating: an event has a few dozen
// members and the daemon checks about a hundred events per forward pass of a model.
func (e *Event) slot(tok []byte) *[]byte {
	inner := tok[1 : len(tok)-1]
	if bytes.IndexByte(inner, '\\') >= 0 {
		inner = []byte(keyName(tok))
	}
	switch string(inner) {
	case "event":
		return &e.name
	case "component_type":
		return &e.component
	case "layer_id":
		return &e.layerID
	case "layer":
		return &e.layer
	case "timestamp":
		return &e.timestamp
	case "duration_us":
		return &e.durationUS
	case "flops":
		return &e.flops
	}
	return nil
}

// keyName is the text of a string token: its bytes between the quotes, or, when it has
// escapes or bytes outside ASCII, what encoding/json decodes it to (invalid UTF-8 becomes
// U+FFFD there, and must here too).
func keyName(tok []byte) string {
	inner := tok[1 : len(tok)-1]
	plain := true
	for _, c := range inner {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return string(inner)
	}
	var s string
	if json.Unmarshal(tok, &s) != nil {
		return ""
	}
	return s
}
