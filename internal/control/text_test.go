package control

import (
	"errors"
	"strings"
	"testing"
)

// TestBodiesRejectBadText: every body is checked as bytes before encoding/json could turn
// invalid UTF-8 or a lone surrogate escape into U+FFFD; both are bad_message.
func TestBodiesRejectBadText(t *testing.T) {
	tests := []struct {
		name string
		body string
		sub  string // "" means accepted
	}{
		{"ascii", `{"seq":1,"index":0,"token_id":7,"text":"hello"}`, ""},
		{"utf-8", `{"seq":1,"index":0,"token_id":7,"text":"héllo ✓ 𝄞"}`, ""},
		{"escaped pair", `{"seq":1,"index":0,"token_id":7,"text":"\ud834\udd1e"}`, ""},
		{"raw 0xff 0xfe", "{\"seq\":1,\"index\":0,\"token_id\":7,\"text\":\"model.\xff\xfe\"}", "not valid UTF-8 at byte 46"},
		{"truncated rune", "{\"seq\":1,\"index\":0,\"token_id\":7,\"text\":\"\xe2\x82\"}", "not valid UTF-8"},
		{"invalid key", "{\"seq\":1,\"index\":0,\"token_id\":7,\"te\xffxt\":\"a\"}", "not valid UTF-8"},
		{"lone surrogate escape", `{"seq":1,"index":0,"token_id":7,"text":"\udcff"}`, `unpaired surrogate escape \udcff`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeRaw(Version, TypeToken, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			m, derr := Decode(b)
			// Unmarshal checks on its own too: a Message built without Decode.
			raw := Message{Version: Version, Type: TypeToken, Body: []byte(tc.body)}
			var tok Token
			uerr := raw.Unmarshal(&tok, "seq", "index")
			if tc.sub == "" {
				if derr != nil || uerr != nil {
					t.Fatalf("rejected: decode %v, unmarshal %v", derr, uerr)
				}
				if err := m.Unmarshal(&tok, "seq"); err != nil || strings.ContainsRune(tok.Text, '\uFFFD') {
					t.Fatalf("text %q, err %v", tok.Text, err)
				}
				return
			}
			for _, err := range []error{derr, uerr} {
				if !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), tc.sub) || !strings.Contains(err.Error(), "TOKEN body") {
					t.Fatalf("err = %v, want bad message naming the TOKEN body, containing %q", err, tc.sub)
				}
			}
		})
	}
}
