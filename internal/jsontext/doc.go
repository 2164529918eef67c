// Package jsontext checks that JSON bytes from another process or from disk carry valid
// Unicode text before encoding/json sees them, because encoding/json replaces invalid UTF-8
// and unpaired surrogate escapes with U+FFFD without a word.
package jsontext
