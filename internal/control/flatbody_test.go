package control

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// flatTokenCases are TOKEN bodies: the plain ones must take the fast path, the others must
// fall back; either way the result must be encoding/json's.
var flatTokenCases = []struct {
	body  string
	plain bool
}{
	{`{"seq":5,"index":2,"token_id":1234,"text":" the","position":8}`, true},
	{`{"seq":9,"index":3,"token_id":42,"text":"!","head":8192}`, true},
	{` { "seq" : 0 ,"index":0 } `, true},
	{`{"index":18446744073709551615,"seq":1,"token_id":-9223372036854775808,"text":"héllo ✓ 𝄞"}`, true},
	{`{"seq":1,"index":2,"token_id":9223372036854775807,"position":-1,"text":""}`, true},
	{`{"seq":1,"index":2,"token_id":-0}`, true},
	// Fall back: what the fast path does not read.
	{`{"seq":1,"index":2,"text":"a\"b"}`, false},                  // an escape
	{`{"seq":1,"index":2,"text":"\u00e9"}`, false},                // a \u escape
	{`{"seq":1,"index":2,"text":"\udcff"}`, false},                // a lone surrogate: an error
	{"{\"seq\":1,\"index\":2,\"text\":\"\xff\"}", false},          // invalid UTF-8: an error
	{`{"seq":1,"index":2,"position":null}`, false},                // null
	{`{"seq":1,"index":null}`, false},                             // a required key null: an error
	{`{"seq":1}`, false},                                          // a required key missing: an error
	{`{}`, false},                                                 // both missing
	{`{"seq":1,"index":2,"seq":3}`, false},                        // a repeated key
	{`{"Seq":1,"index":2}`, false},                                // encoding/json matches keys in any case
	{`{"seq":1,"index":2,"extra":[1,2]}`, false},                  // an unknown key
	{`{"seq":1.0,"index":2}`, false},                              // a fraction: an error
	{`{"seq":1e2,"index":2}`, false},                              // an exponent: an error
	{`{"seq":-1,"index":2}`, false},                               // negative into uint64: an error
	{`{"seq":18446744073709551616,"index":2}`, false},             // out of range: an error
	{`{"seq":1,"index":2,"token_id":9223372036854775808}`, false}, // out of int64: an error
	{`{"seq":01,"index":2}`, false},                               // a leading zero: not JSON
	{`{"seq":"1","index":2}`, false},                              // a string for a number: an error
	{`{"seq":1,"index":2,"text":5}`, false},                       // a number for a string: an error
	{`{"seq":1,"index":2,}`, false},                               // not JSON
	{`{"seq":1,"index":2} x`, false},                              // not JSON
	{`[1,2]`, false},                                              // not an object
	{`{"seq":1,"index":2,"text":"tab	here"}`, false},              // a raw control character: not JSON
	{`{"seq":--1,"index":2}`, false},                              // not JSON
	{`{"seq":-,"index":2}`, false},                                // not JSON
}

// sameAsGeneral checks that fast returns what m.Unmarshal(v, required...) does: the same
// error text, or the same value.
func sameAsGeneral[T any](t *testing.T, typ Type, body []byte, fast func(Message, *T) error, required ...string) {
	t.Helper()
	m := Message{Version: Version, Type: typ, Body: body}
	var got, want T
	errFast := fast(m, &got)
	errSlow := m.Unmarshal(&want, required...)
	if (errFast == nil) != (errSlow == nil) || errFast != nil && errFast.Error() != errSlow.Error() {
		t.Fatalf("%q: fast error %v, Unmarshal %v", body, errFast, errSlow)
	}
	if errFast == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: fast %+v, Unmarshal %+v", body, got, want)
	}
}

func sameTokenAsGeneral(t *testing.T, body []byte) {
	t.Helper()
	sameAsGeneral(t, TypeToken, body, Message.UnmarshalToken, "seq", "index")
}

func samePublishAsGeneral(t *testing.T, body []byte) {
	t.Helper()
	sameAsGeneral(t, TypePublish, body, Message.UnmarshalPublish, "head", "seq")
}

func TestFlatToken(t *testing.T) {
	for _, tc := range flatTokenCases {
		var tok Token
		if got := flatToken([]byte(tc.body), &tok); got != tc.plain {
			t.Errorf("%q: fast path %v, want %v", tc.body, got, tc.plain)
		}
		sameTokenAsGeneral(t, []byte(tc.body))
	}
}

// TestFlatGoldenBodies: the TOKEN and PUBLISH bodies every client encodes (the golden wire
// files Go, Python and C produce byte for byte) take the fast path.
func TestFlatGoldenBodies(t *testing.T) {
	for _, name := range []string{"token.bin", "token_head.bin"} {
		m := goldenBody(t, name)
		var tok Token
		if !flatToken(m.Body, &tok) {
			t.Errorf("%s: %s does not take the fast path", name, m.Body)
		}
		sameTokenAsGeneral(t, m.Body)
	}
	m := goldenBody(t, "publish.bin")
	var p Publish
	if !flatPublish(m.Body, &p) || p != (Publish{Head: 4096, Seq: 3}) {
		t.Errorf("publish.bin: fast path %+v", p)
	}
}

func goldenBody(t *testing.T, name string) Message {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestFlatPublish(t *testing.T) {
	for _, tc := range []struct {
		body  string
		plain bool
	}{
		{`{"head":4096,"seq":3}`, true},
		{`{"seq":0,"head":0}`, true},
		{`{"head":4096}`, false},
		{`{"head":4096,"seq":3,"head":1}`, false},
		{`{"head":4096,"seq":3,"drops":0}`, false},
		{`{"head":4096.5,"seq":3}`, false},
		{`{"head":"4096","seq":3}`, false},
	} {
		var p Publish
		if got := flatPublish([]byte(tc.body), &p); got != tc.plain {
			t.Errorf("%q: fast path %v, want %v", tc.body, got, tc.plain)
		}
		samePublishAsGeneral(t, []byte(tc.body))
	}
}

// FuzzFlatToken holds the fast TOKEN decoder to encoding/json's on any body: same value,
// same error.
func FuzzFlatToken(f *testing.F) {
	for _, tc := range flatTokenCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sameTokenAsGeneral(t, b)
	})
}

// FuzzFlatPublish is FuzzFlatToken for PUBLISH.
func FuzzFlatPublish(f *testing.F) {
	for _, s := range []string{`{"head":4096,"seq":3}`, `{"seq":1,"head":2,"seq":3}`, `{"head":-1,"seq":0}`, `{"head":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		samePublishAsGeneral(t, b)
	})
}

func BenchmarkUnmarshalToken(b *testing.B) {
	m := Message{Version: Version, Type: TypeToken,
		Body: []byte(`{"seq":1234,"index":77,"token_id":31999,"text":" hello","position":80,"head":123456789}`)}
	b.Run("general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t Token
			if err := m.Unmarshal(&t, "seq", "index"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("flat", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t Token
			if err := m.UnmarshalToken(&t); err != nil {
				b.Fatal(err)
			}
		}
	})
}
