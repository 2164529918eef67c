package jsontext

// The scanners below walk JSON text that has already been checked (json.Valid, or compacted
// by encoding/json) and need no error paths; on other bytes they stop at the end of b rather
// than look past it. control (a RESOURCES body's members) and resevent (an event's fields)
// both read with them.

// SkipSpace returns the index of the first byte at or after i that is not JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// SkipValue returns the end of the value starting at b[i] (a string, object, array, number,
// true, false or null).
func SkipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = SkipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	default: // number, true, false, null
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
			i++
		}
		return i
	}
}

// SkipString returns the end of the string token starting at b[i] (the opening quote).
func SkipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}
