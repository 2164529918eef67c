package jsontext

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Sentinel errors returned by Check.
var (
	// ErrInvalidUTF8 is returned for bytes that are not valid UTF-8 (anywhere: in a
	// string, a key or between tokens).
	ErrInvalidUTF8 = errors.New("not valid UTF-8")
	// ErrLoneSurrogate is returned for a \uD800–\uDFFF escape that is not half of a
	// high-then-low pair, which is what Python's json.dumps writes for a str holding a lone
	// surrogate (text decoded with errors="surrogateescape", say).
	ErrLoneSurrogate = errors.New("unpaired surrogate escape")
)

// Check reports whether b holds only valid Unicode text: valid UTF-8, and no string escape
// that decodes to a lone surrogate. Errors wrap ErrInvalidUTF8 or ErrLoneSurrogate and give
// the byte offset. The verdict is exact for valid JSON (json.Valid); other input is safe to
// pass (no panic) but may be accepted, so check validity too.
func Check(b []byte) error {
	if !utf8.Valid(b) {
		i := 0
		for i < len(b) {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			i += n
		}
		return fmt.Errorf("%w at byte %d", ErrInvalidUTF8, i)
	}
	inStr := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !inStr {
			inStr = c == '"'
			continue
		}
		switch c {
		case '"':
			inStr = false
		case '\\':
			if i+1 >= len(b) {
				return nil // not valid JSON; the caller's json.Valid said otherwise
			}
			if b[i+1] != 'u' {
				i++
				continue
			}
			r, ok := hex4(b, i+2)
			if !ok {
				return nil
			}
			at := i
			i += 5 // at the escape's last hex digit
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Errorf("%w \\u%04x at byte %d", ErrLoneSurrogate, r, at)
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := rune(0), i+2 < len(b) && b[i+1] == '\\' && b[i+2] == 'u'
				if ok {
					lo, ok = hex4(b, i+3)
				}
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return fmt.Errorf("%w \\u%04x at byte %d", ErrLoneSurrogate, r, at)
				}
				i += 6
			}
		}
	}
	return nil
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}
