package jsontext

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	deep := strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)
	tests := []struct {
		name    string
		in      string
		want    error // nil: accepted
		sub     string
		compact bool
	}{
		{"object", `{"a":[1,-2.5e+3,true,false,null,"x"],"b":{}}`, nil, "", true},
		{"white space", " {\"a\" : [ 1 ,2 ]}\n", nil, "", false},
		{"white space in a string only", `{"a":" b "}`, nil, "", true},
		{"scalar", `-0.5E-7`, nil, "", true},
		{"escapes", `"\"\\\/\b\f\n\r\t\u00e9\ud834\udd1e"`, nil, "", true},
		{"max depth", deep, nil, "", true},
		{"too deep", "[" + deep + "]", ErrSyntax, "nested deeper than 10000", false},
		{"empty", ``, ErrSyntax, "unexpected end", false},
		{"trailing comma", `{"a":1,}`, ErrSyntax, `unexpected '}' at byte 7`, false},
		{"two values", `{} {}`, ErrSyntax, "after the top-level value", false},
		{"leading zero", `01`, ErrSyntax, "after the top-level value", false},
		{"bare dot", `1.`, ErrSyntax, "after a decimal point", false},
		{"bad exponent", `1e+`, ErrSyntax, "in an exponent", false},
		{"control char", "\"a\x01\"", ErrSyntax, "control character", false},
		{"bad escape", `"\x"`, ErrSyntax, "string escape", false},
		{"short \\u", `"\u12"`, ErrSyntax, `\u escape`, false},
		{"unterminated", `"abc`, ErrSyntax, "in a string", false},
		{"bad literal", `tru`, ErrSyntax, "in a literal", false},
		{"key not a string", `{1:2}`, ErrSyntax, "object key", false},
		{"raw byte outside a string", "[\xff]", ErrSyntax, "looking for a value", false},
		{"lone low surrogate", `{"t":"\udcff"}`, ErrLoneSurrogate, `\udcff at byte 6`, false},
		{"high then not low", `["\ud834\u0041"]`, ErrLoneSurrogate, `\ud834 at byte 2`, false},
		{"invalid UTF-8 wins over an earlier surrogate", "[\"\\udcff\",\"\xff\"]", ErrInvalidUTF8, "at byte 11", false},
		{"syntax wins over UTF-8", "[\"\xff\",]", ErrSyntax, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			compact, err := Validate([]byte(tt.in))
			if tt.want == nil {
				if err != nil || compact != tt.compact {
					t.Fatalf("Validate = %v, %v; want nil, compact %v", compact, err, tt.compact)
				}
				return
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.sub) || compact {
				t.Fatalf("Validate = %v, %v; want %v containing %q", compact, err, tt.want, tt.sub)
			}
		})
	}
}

// FuzzValidate holds Validate to what it replaces: json.Valid, then Check, then json.Compact.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{`{"a":"b"}`, ` [1, 2.5e3 ,{"k":null}] `, `{"text":"\udcff"}`, "{\"t\":\"\xff\"}",
		`["\ud834\udd1e"]`, `"\ud834"`, `-0`, `01`, `1.e5`, "\"\x1f\"", `{"a":tru}`, `[[[[]]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		compact, err := Validate(b)
		if !json.Valid(b) {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("%q: json.Valid refuses it, Validate says %v", b, err)
			}
			return
		}
		if want := Check(b); (err == nil) != (want == nil) || err != nil && err.Error() != want.Error() {
			t.Fatalf("%q: Check says %v, Validate %v", b, want, err)
		}
		if err != nil {
			return
		}
		var c bytes.Buffer
		if e := json.Compact(&c, b); e != nil {
			t.Fatalf("%q: valid, but json.Compact fails: %v", b, e)
		}
		if compact != bytes.Equal(c.Bytes(), b) {
			t.Fatalf("%q: compact %v, but json.Compact gives %q", b, compact, c.Bytes())
		}
	})
}
