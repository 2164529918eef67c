package control

import (
	"math"
	"unicode/utf8"

	"github.com/strap-llm/strap/internal/jsontext"
)

// The bodies a client sends once per generated token (TOKEN, and PUBLISH where the daemon
// has no published cursor) are read here without encoding/json when they have the plain
// form our clients write: one flat object of known lower-case keys, each once, holding
// unsigned or signed integers and strings without escapes. Anything else — an escape, a
// null, an unknown or repeated key, a number with a fraction or out of range, a missing
// required key — is left to Message.Unmarshal, so what is accepted and every error stay
// encoding/json's (FuzzFlatToken and FuzzFlatPublish hold the two to each other).
//
// Why: strapd's CPU per generated token is what a model with torch (or ggml) on every core
// loses. A perf profile of strapd under a llama.cpp capture put ≈ 10 % of its samples in
// decoding the TOKEN body through reflection, a map for the required keys and 32 allocations;
// after this, 1 %, though strapd's CPU per token fell by less than the runs' spread
// (docs/PERFORMANCE.md, "TOKEN bodies without reflection").

// UnmarshalToken decodes a TOKEN body into t (seq and index required), as
// m.Unmarshal(t, "seq", "index") does.
func (m Message) UnmarshalToken(t *Token) error {
	if flatToken(m.Body, t) {
		return nil
	}
	*t = Token{}
	return m.Unmarshal(t, "seq", "index")
}

// UnmarshalPublish decodes a PUBLISH body into p (head and seq required), as
// m.Unmarshal(p, "head", "seq") does.
func (m Message) UnmarshalPublish(p *Publish) error {
	if flatPublish(m.Body, p) {
		return nil
	}
	*p = Publish{}
	return m.Unmarshal(p, "head", "seq")
}

// flatToken fills t from b and reports true when b has the plain form (above); on false,
// t holds whatever was read and the caller decodes b the general way.
func flatToken(b []byte, t *Token) bool {
	const (
		kSeq = 1 << iota
		kIndex
		kTokenID
		kText
		kPosition
		kHead
	)
	var pos int64
	var head uint64
	seen, ok := flatObject(b, func(key, val []byte) (bit uint8, ok bool) {
		switch string(key) {
		case "seq":
			t.Seq, ok = flatUint(val)
			return kSeq, ok
		case "index":
			t.Index, ok = flatUint(val)
			return kIndex, ok
		case "token_id":
			t.TokenID, ok = flatInt(val)
			return kTokenID, ok
		case "text":
			var s []byte
			if s, ok = flatString(val); ok {
				t.Text = string(s)
			}
			return kText, ok
		case "position":
			pos, ok = flatInt(val)
			return kPosition, ok
		case "head":
			head, ok = flatUint(val)
			return kHead, ok
		}
		return 0, false
	})
	if !ok || seen&(kSeq|kIndex) != kSeq|kIndex {
		return false
	}
	if seen&kPosition != 0 {
		t.Position = &pos
	}
	if seen&kHead != 0 {
		t.Head = &head
	}
	return true
}

// flatPublish is flatToken for PUBLISH {"head", "seq"}.
func flatPublish(b []byte, p *Publish) bool {
	seen, ok := flatObject(b, func(key, val []byte) (bit uint8, ok bool) {
		switch string(key) {
		case "head":
			p.Head, ok = flatUint(val)
			return 1, ok
		case "seq":
			p.Seq, ok = flatUint(val)
			return 2, ok
		}
		return 0, false
	})
	return ok && seen == 3
}

// flatObject walks b as one JSON object whose keys are strings without escapes and whose
// values are numbers or strings without escapes (white space allowed where JSON allows
// it). field reads each member — its key without quotes, its value as written — and
// returns the key's bit (one per known key) and whether it read the value. flatObject
// returns the bits of the keys met, and false as soon as b is anything else, field fails,
// or a key comes twice.
func flatObject(b []byte, field func(key, val []byte) (bit uint8, ok bool)) (seen uint8, ok bool) {
	i := jsontext.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	i = jsontext.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return 0, jsontext.SkipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, false
		}
		end := plainStringEnd(b, i)
		if end < 0 {
			return 0, false
		}
		key := b[i+1 : end-1]
		i = jsontext.SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return 0, false
		}
		i = jsontext.SkipSpace(b, i+1)
		if i >= len(b) {
			return 0, false
		}
		start := i
		if b[i] == '"' {
			if i = plainStringEnd(b, i); i < 0 {
				return 0, false
			}
		} else {
			for i < len(b) && (b[i] == '-' || b[i] >= '0' && b[i] <= '9') {
				i++
			}
			if i == start {
				return 0, false // null, true, false, an object, an array, a fraction
			}
		}
		bit, ok := field(key, b[start:i])
		if !ok || seen&bit != 0 {
			return 0, false
		}
		seen |= bit
		i = jsontext.SkipSpace(b, i)
		if i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case ',':
			i = jsontext.SkipSpace(b, i+1)
		case '}':
			return seen, jsontext.SkipSpace(b, i+1) == len(b)
		default:
			return 0, false // a fraction or exponent lands here too: not plain
		}
	}
}

// plainStringEnd returns the end of the string token at b[i] (its opening quote) when it
// holds no escape and no control character and is valid UTF-8, else -1.
func plainStringEnd(b []byte, i int) int {
	ascii := true
	for j := i + 1; j < len(b); j++ {
		c := b[j]
		switch {
		case c == '"':
			if !ascii && !utf8.Valid(b[i+1:j]) {
				return -1
			}
			return j + 1
		case c == '\\' || c < 0x20:
			return -1
		case c >= 0x80:
			ascii = false
		}
	}
	return -1
}

// flatString returns the contents of a string value from flatObject.
func flatString(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	return v[1 : len(v)-1], true
}

// flatUint parses a JSON integer without sign, fraction or exponent into a uint64; false
// for anything else (a leading zero, a minus, out of range).
func flatUint(v []byte) (uint64, bool) {
	if len(v) == 0 || len(v) > 20 || v[0] == '0' && len(v) > 1 {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// flatInt parses a JSON integer (optional minus, no fraction or exponent) into an int64.
func flatInt(v []byte) (int64, bool) {
	neg := len(v) > 0 && v[0] == '-'
	if neg {
		v = v[1:]
	}
	u, ok := flatUint(v)
	switch {
	case !ok || u > 1<<63 || !neg && u == 1<<63:
		return 0, false
	case u == 1<<63:
		return math.MinInt64, true
	case neg:
		return -int64(u), true
	}
	return int64(u), true
}
