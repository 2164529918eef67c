package jsontext

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrSyntax is returned by Validate for bytes that are not one JSON value, as json.Valid
// judges them (RFC 8259; nesting at most 10000 deep).
var ErrSyntax = errors.New("not valid JSON")

// maxDepth is encoding/json's nesting limit: json.Valid refuses deeper text.
const maxDepth = 10000

// Validate checks in one pass what json.Valid and Check check in two: b is one JSON value
// (surrounding white space allowed) holding only valid Unicode text. Its verdict and error
// are theirs: an error wrapping ErrSyntax when json.Valid(b) is false, else Check(b)'s error
// (FuzzValidate holds it to both). compact says that b has no white space outside its
// strings (json.Compact would return it unchanged), so a caller that wants compact text can
// skip compacting it.
//
// The daemon reads every control message and every RESOURCES event through it: a client's
// resource events are about a hundred small objects per forward pass, and validating them
// twice and compacting them once cost a quarter of strapd's CPU in a decode with resource
// events (docs/PERFORMANCE.md).
func Validate(b []byte) (compact bool, err error) {
	v := validator{b: b, compact: true, badUTF8: -1, lone: -1}
	i, err := v.value(v.space(0), 0)
	if err == nil {
		if i = v.space(i); i != len(b) {
			err = v.syntax(i, "after the top-level value")
		}
	}
	switch {
	case err != nil:
		return false, err
	case v.badUTF8 >= 0: // Check reports invalid UTF-8 before any escape
		return false, fmt.Errorf("%w at byte %d", ErrInvalidUTF8, v.badUTF8)
	case v.lone >= 0:
		return false, fmt.Errorf("%w \\u%04x at byte %d", ErrLoneSurrogate, v.loneRune, v.lone)
	}
	return v.compact, nil
}

type validator struct {
	b       []byte
	compact bool
	// The first Unicode faults met, reported only when the syntax is valid (json.Valid is
	// checked first); -1: none.
	badUTF8, lone int
	loneRune      rune
}

func (v *validator) space(i int) int {
	for i < len(v.b) {
		switch v.b[i] {
		case ' ', '\t', '\n', '\r':
			v.compact = false
			i++
		default:
			return i
		}
	}
	return i
}

func (v *validator) syntax(i int, where string) error {
	if i >= len(v.b) {
		return fmt.Errorf("%w: unexpected end %s", ErrSyntax, where)
	}
	return fmt.Errorf("%w: unexpected %q at byte %d %s", ErrSyntax, v.b[i], i, where)
}

// value returns the end of the value starting at b[i], at nesting depth depth.
func (v *validator) value(i, depth int) (int, error) {
	b := v.b
	if i >= len(b) {
		return i, v.syntax(i, "looking for a value")
	}
	switch c := b[i]; {
	case c == '{' || c == '[':
		if depth++; depth > maxDepth {
			return i, fmt.Errorf("%w: nested deeper than %d at byte %d", ErrSyntax, maxDepth, i)
		}
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		i = v.space(i + 1)
		if i < len(b) && b[i] == end {
			return i + 1, nil
		}
		for {
			var err error
			if end == '}' {
				if i >= len(b) || b[i] != '"' {
					return i, v.syntax(i, "looking for an object key")
				}
				if i, err = v.str(i); err != nil {
					return i, err
				}
				if i = v.space(i); i >= len(b) || b[i] != ':' {
					return i, v.syntax(i, "after an object key")
				}
				i = v.space(i + 1)
			}
			if i, err = v.value(i, depth); err != nil {
				return i, err
			}
			if i = v.space(i); i < len(b) && b[i] == ',' {
				i = v.space(i + 1)
				continue
			}
			if i < len(b) && b[i] == end {
				return i + 1, nil
			}
			return i, v.syntax(i, "after a member")
		}
	case c == '"':
		return v.str(i)
	case c == '-' || c >= '0' && c <= '9':
		return v.number(i)
	case c == 't':
		return v.literal(i, "true")
	case c == 'f':
		return v.literal(i, "false")
	case c == 'n':
		return v.literal(i, "null")
	}
	return i, v.syntax(i, "looking for a value")
}

func (v *validator) literal(i int, word string) (int, error) {
	for k := 0; k < len(word); k++ {
		if i+k >= len(v.b) || v.b[i+k] != word[k] {
			return i + k, v.syntax(i+k, "in a literal")
		}
	}
	return i + len(word), nil
}

func digit(c byte) bool { return c >= '0' && c <= '9' }

func (v *validator) number(i int) (int, error) {
	b := v.b
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i++; i < len(b) && digit(b[i]); i++ {
		}
	default:
		return i, v.syntax(i, "in a number")
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || !digit(b[i]) {
			return i, v.syntax(i, "after a decimal point")
		}
		for i++; i < len(b) && digit(b[i]); i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !digit(b[i]) {
			return i, v.syntax(i, "in an exponent")
		}
		for i++; i < len(b) && digit(b[i]); i++ {
		}
	}
	return i, nil
}

// str returns the end of the string starting at b[i] (its opening quote).
func (v *validator) str(i int) (int, error) {
	b := v.b
	for i++; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			if i+1 >= len(b) {
				return i + 1, v.syntax(i+1, "in a string escape")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				r, ok := hex4(b, i+2)
				if !ok {
					return i + 2, v.syntax(i+2, "in a \\u escape")
				}
				at := i
				i += 6
				switch {
				case r >= 0xDC00 && r <= 0xDFFF:
					v.loneAt(at, r)
				case r >= 0xD800 && r <= 0xDBFF:
					if i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
						if lo, ok := hex4(b, i+2); ok && lo >= 0xDC00 && lo <= 0xDFFF {
							i += 6
							continue
						}
					}
					v.loneAt(at, r)
				}
			default:
				return i + 1, v.syntax(i+1, "in a string escape")
			}
		case c < 0x20:
			return i, v.syntax(i, "in a string (a control character)")
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				if v.badUTF8 < 0 {
					v.badUTF8 = i
				}
				n = 1
			}
			i += n
		}
	}
	return i, v.syntax(i, "in a string")
}

func (v *validator) loneAt(at int, r rune) {
	if v.lone < 0 {
		v.lone, v.loneRune = at, r
	}
}
