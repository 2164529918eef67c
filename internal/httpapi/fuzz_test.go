package httpapi

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzResourceLine: any bytes either parse as one JSON object whose raw text is kept, or
// give an error; never a panic.
func FuzzResourceLine(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 1.5, "event": "load", "layer": 3}`, `{"timestamp": "1704097842123456", "layer_id": 0}`,
		`{"timestamp": 1704097842123456, "layer_id": null, "layer": "x"}`, `{"timestamp": "-1"}`,
		`{"layer": "model.layers.0.mlp", "event": "alloc", "bytes": 4096}`,
		`{"timestamp": "soon"}`, `{"layer": [1]}`, `{} {}`, `null`, `[1,2]`, `{"event": 5}`, "{\"a\":1}\r",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := parseResourceLine(b)
		if err != nil {
			return
		}
		var m map[string]any
		if json.Unmarshal(l.Raw, &m) != nil || m == nil {
			t.Fatalf("accepted %q, which is not one JSON object", b)
		}
	})
}

// FuzzTailer: a log of arbitrary bytes, read in one pass or appended in two pieces, gives
// the same events and malformed lines at the same line numbers.
func FuzzTailer(f *testing.F) {
	f.Add([]byte("{\"event\":\"a\"}\nnot json\n\n{\"event\":\"b\",\"layer\":2}\n{\"trunc"), 7)
	f.Add([]byte("\n\n\n"), 1)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		if cut < 0 || cut > len(b) {
			cut = len(b) / 2
		}
		dir := t.TempDir()
		out := filepath.Join(dir, "x.strap")
		read := func(parts ...[]byte) (ev []Event, bad []Malformed) {
			os.Remove(out + ResourceSuffix)
			tl := newTailer(1, 0, out)
			defer tl.close()
			for _, p := range parts {
				fh, err := os.OpenFile(out+ResourceSuffix, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				fh.Write(p)
				fh.Close()
				for {
					before := tl.off
					if err := tl.poll(func(e Event) { ev = append(ev, e) }, func(m Malformed) { bad = append(bad, m) }, &Filter{}); err != nil {
						t.Fatal(err)
					}
					if tl.off == before {
						break
					}
				}
			}
			return ev, bad
		}
		e1, m1 := read(b)
		e2, m2 := read(b[:cut], b[cut:])
		if len(e1) != len(e2) || len(m1) != len(m2) {
			t.Fatalf("one pass %d events %d bad; two pieces %d events %d bad", len(e1), len(m1), len(e2), len(m2))
		}
		for i := range e1 {
			if e1[i].Line != e2[i].Line || !bytes.Equal(e1[i].Event, e2[i].Event) {
				t.Fatalf("event %d: %+v vs %+v", i, e1[i], e2[i])
			}
		}
	})
}
