package jsontext

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error // nil: accepted
		sub  string
	}{
		{"ascii", `{"text":"hello"}`, nil, ""},
		{"utf-8", `{"text":"héllo ✓ 𝄞","k":[1,"\u00e9"]}`, nil, ""},
		{"escaped pair", `{"text":"\ud834\udd1e"}`, nil, ""},
		{"escaped pair upper hex", `{"text":"\uD834\uDD1E"}`, nil, ""},
		{"escaped backslash then u", `{"text":"\\udcff"}`, nil, ""},
		{"escaped quote then u", `{"text":"\"\udcff"}`, ErrLoneSurrogate, `\udcff at byte 11`},
		{"U+FFFD itself", `{"text":"\ufffd �"}`, nil, ""},
		{"raw 0xff in a string", "{\"text\":\"model.\xff\xfe\"}", ErrInvalidUTF8, "at byte 15"},
		{"raw 0xff in a key", "{\"te\xffxt\":1}", ErrInvalidUTF8, "at byte 4"},
		{"overlong slash", "{\"text\":\"\xc0\xaf\"}", ErrInvalidUTF8, ""},
		{"truncated rune", "{\"text\":\"\xe2\x82\"}", ErrInvalidUTF8, ""},
		{"UTF-8 encoded surrogate", "{\"text\":\"\xed\xa0\x80\"}", ErrInvalidUTF8, ""},
		{"lone low surrogate", `{"text":"\udcff"}`, ErrLoneSurrogate, `\udcff at byte 9`},
		{"lone high surrogate at the end", `{"text":"a\ud834"}`, ErrLoneSurrogate, `\ud834`},
		{"high then non-surrogate escape", `{"text":"\ud834\u0041"}`, ErrLoneSurrogate, ""},
		{"high then letter", `{"text":"\ud834x"}`, ErrLoneSurrogate, ""},
		{"two highs", `{"text":"\ud834\ud834"}`, ErrLoneSurrogate, ""},
		{"low then high", `{"text":"\udd1e\ud834"}`, ErrLoneSurrogate, `\udd1e`},
		{"surrogate in a key", `{"\udcff":1}`, ErrLoneSurrogate, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !json.Valid([]byte(tc.in)) {
				t.Fatalf("test input is not JSON")
			}
			err := Check([]byte(tc.in))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.sub) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.sub)
			}
		})
	}
}

// FuzzCheck: Check accepts exactly the JSON that encoding/json decodes without inventing a
// U+FFFD. For JSON it accepts, every string decoded holds only the replacement characters
// the input spelled out; for JSON it rejects, decoding must indeed lose something.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"a":"b"}`, `{"text":"\udcff"}`, "{\"t\":\"\xff\"}", `["\ud834\udd1e"]`,
		`"\ud834"`, `{"x":"\\u00e9\u00e9"}`, `{"t":"\ufffd"}`, "\"\xef\xbf\xbd\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := Check(b) // any input: no panic
		if !json.Valid(b) {
			return
		}
		invented := replacements(t, b) > spelled(b)
		if err == nil && invented {
			t.Fatalf("accepted %q, but decoding invented U+FFFD", b)
		}
		if err != nil && !invented {
			t.Fatalf("rejected %q (%v), but it decodes without loss", b, err)
		}
	})
}

// replacements counts U+FFFD in every string token of the JSON in b, keys included (a
// token walk, not a map: a duplicate key's first value counts too).
func replacements(t *testing.T, b []byte) int {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // a number beyond float64 is valid JSON
	n := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return n
		}
		if err != nil {
			t.Fatalf("json.Valid but the token walk fails: %v", err)
		}
		if s, ok := tok.(string); ok {
			n += strings.Count(s, "\uFFFD")
		}
	}
}

// spelled counts the U+FFFD an input writes itself: raw, or as a \ufffd escape.
func spelled(b []byte) int {
	n := 0
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == '\uFFFD' && size == 3 {
			n++
		}
		if b[i] == '\\' && i+1 < len(b) {
			if b[i+1] == 'u' && i+6 <= len(b) && strings.EqualFold(string(b[i+2:i+6]), "fffd") {
				n++
			}
			i += 2
			continue
		}
		i += size
	}
	return n
}
