package trace

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestSpanTail(t *testing.T) {
	lines := `{"event":"start","corr_id":"a","pid":10,"tid":11,"t":100.0}
{"event":"start","corr_id":"b","pid":10,"tid":12,"t":101.5}
not json
{"event":"end","corr_id":"a","pid":10,"tid":11,"t":102.0}
{"event":"end","corr_id":"zz","pid":10,"tid":11,"t":102.0}
{"event":"start","corr_id":"c","pid":10,"tid":11,"t":103.0}
{"event":"end","corr_id":"c","pid":10,"tid":11,"t":103.5}
{"event":"start","corr_id":"d","pid":10,"tid":11,"t":1`
	var tail SpanTail
	tail.open = map[spanKey][]float64{}
	var off int64
	tail.Feed([]byte(lines), &off)
	if want := int64(len(lines) - len(`{"event":"start","corr_id":"d","pid":10,"tid":11,"t":1`)); off != want {
		t.Fatalf("offset %d, want %d (the partial line is left)", off, want)
	}
	if tail.Bad != 2 {
		t.Fatalf("bad lines %d, want 2 (not json, end without start): %v", tail.Bad, tail.LastErr)
	}
	for _, tc := range []struct {
		name   string
		t0, t1 float64
		want   []string // corr_id, "+" when open
	}{
		{"before everything", 90, 99, nil},
		{"first interval", 99, 101, []string{"a"}},
		{"a ends, b open", 101, 102.5, []string{"a", "b+"}},
		// a ended at 102 ≤ 102.5: forgotten by the previous call.
		{"c inside", 102.5, 104, []string{"b+", "c"}},
		{"after c", 104, 110, []string{"b+"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range tail.Overlapping(tc.t0, tc.t1) {
				id := s.CorrID
				if s.End == nil {
					id += "+"
				}
				got = append(got, id)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("spans %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("spans %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestSpanTailFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "spans.jsonl")
	if err := os.WriteFile(p, []byte(`{"event":"start","corr_id":"old","pid":1,"tid":1,"t":5}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tail, err := NewSpanTail(p, false)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString(`{"event":"start","corr_id":"new","pid":1,"tid":1,"t":10}` + "\n" + `{"event":"end","corr_id":"new","pid":1,"t`)
	if err := tail.Poll(); err != nil {
		t.Fatal(err)
	}
	if got := tail.Overlapping(0, 20); len(got) != 1 || got[0].CorrID != "new" || got[0].End != nil {
		t.Fatalf("spans %+v: want only the open span started after the tail began", got)
	}
	f.WriteString(`id":1,"t":12}` + "\n")
	if err := tail.Poll(); err != nil {
		t.Fatal(err)
	}
	got := tail.Overlapping(11, 20)
	if len(got) != 1 || got[0].End == nil || *got[0].End != 12 || got[0].Start != 10 || tail.Bad != 0 {
		t.Fatalf("spans %+v bad %d: want new closed at 12", got, tail.Bad)
	}
	// Truncated (a new run): read again from the start.
	if err := os.WriteFile(p, []byte(`{"event":"start","corr_id":"again","pid":2,"tid":2,"t":30}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tail.Poll(); err != nil {
		t.Fatal(err)
	}
	if got := tail.Overlapping(20, 40); len(got) != 1 || got[0].CorrID != "again" {
		t.Fatalf("after truncation: %+v", got)
	}
	missing, err := NewSpanTail(filepath.Join(t.TempDir(), "none"), false)
	if err != nil || missing.Poll() != nil {
		t.Fatalf("a missing spans file is empty until it appears: %v", err)
	}
}

func FuzzSpanTail(f *testing.F) {
	f.Add([]byte(`{"event":"start","corr_id":"a","pid":1,"tid":1,"t":1}` + "\n" + `{"event":"end","corr_id":"a","pid":1,"tid":1,"t":2}` + "\n"))
	f.Add([]byte(`{"event":"end","corr_id":"a","pid":1,"tid":1,"t":1e308}` + "\n{}\n\n[1]\n"))
	f.Add([]byte(`{"event":"start","corr_id":"","pid":-1,"tid":0,"t":NaN}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var tail SpanTail
		tail.open = map[spanKey][]float64{}
		var off int64
		tail.Feed(data, &off)
		if off < 0 || off > int64(len(data)) {
			t.Fatalf("offset %d outside [0, %d]", off, len(data))
		}
		for _, s := range tail.Overlapping(0, 1e300) {
			if s.CorrID == "" || s.PID <= 0 || s.TID <= 0 || (s.End != nil && *s.End < 0) {
				t.Fatalf("bad span accepted: %+v", s)
			}
		}
	})
}

func TestSpanTailDropsOpenSpansOfGoneProcesses(t *testing.T) {
	tail := SpanTail{open: map[spanKey][]float64{}, alive: func(pid int) bool { return pid == 1 }}
	var off int64
	tail.Feed([]byte(`{"event":"start","corr_id":"live","pid":1,"tid":1,"t":1}`+"\n"+
		`{"event":"start","corr_id":"crashed","pid":999999,"tid":5,"t":1}`+"\n"), &off)
	if got := tail.Overlapping(0, 2); len(got) != 1 || got[0].CorrID != "live" {
		t.Fatalf("spans %+v: the crashed process's open span must be dropped", got)
	}
}

// TestSpanTailChunks reads a spans file larger than one chunk, ending in a partial line.
func TestSpanTailChunks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "spans.jsonl")
	var b []byte
	n := 0
	for len(b) < 3*spanChunk {
		id := "r" + strconv.Itoa(n)
		b = append(b, `{"event":"start","corr_id":"`+id+`","pid":1,"tid":1,"t":1}`+"\n"+
			`{"event":"end","corr_id":"`+id+`","pid":1,"tid":1,"t":2}`+"\n"...)
		n++
	}
	b = append(b, `{"event":"start","corr_id":"last","pid":1,"tid":1,"t":3`...)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	tail, err := NewSpanTail(p, true)
	if err != nil {
		t.Fatal(err)
	}
	tail.alive = func(int) bool { return true }
	if err := tail.Poll(); err != nil {
		t.Fatal(err)
	}
	if got := tail.Overlapping(0, 2.5); len(got) != n || tail.Bad != 0 {
		t.Fatalf("%d spans, %d bad; want %d and 0", len(got), tail.Bad, n)
	}
	if want := int64(len(b) - len(`{"event":"start","corr_id":"last","pid":1,"tid":1,"t":3`)); tail.off != want {
		t.Fatalf("offset %d, want %d", tail.off, want)
	}
}
