// Package jsontext reads JSON text at the byte level: it checks that JSON bytes from another
// process or from disk carry valid Unicode text before encoding/json sees them (encoding/json
// replaces invalid UTF-8 and unpaired surrogate escapes with U+FFFD without a word), and scans
// checked text for the ends of values.
package jsontext
