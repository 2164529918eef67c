package resevent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

// goldenDir holds resource-event files written by the Python builders (its README).
const goldenDir = "../../testdata/resource_events"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		err        bool
		event      string
	}{
		{"minimal", `{"event":"compute_execution"}`, false, "compute_execution"},
		{"spaces around and inside", " \t{ \"x\" : [1, {\"event\": 2}] , \"event\" : \"a\" }\r\n", false, "a"},
		{"escaped key", `{"\u0065vent":"kv_cache_update"}`, false, "kv_cache_update"},
		{"escaped name", `{"event":"a\"b"}`, false, `a"b`},
		{"last of a repeated key", `{"event":"a","event":"b"}`, false, "b"},
		{"repeat ending empty", `{"event":"a","event":""}`, true, ""},
		{"key case matters", `{"Event":"a"}`, true, ""},
		{"no event", `{"layer":1}`, true, ""},
		{"event not a string", `{"event":5}`, true, ""},
		{"event null", `{"event":null}`, true, ""},
		{"empty event", `{"event":""}`, true, ""},
		{"array", `[{"event":"a"}]`, true, ""},
		{"two objects", `{"event":"a"} {"event":"b"}`, true, ""},
		{"not JSON", `not json`, true, ""},
		{"empty", ``, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Parse([]byte(tc.line))
			if tc.err {
				if !errors.Is(err, ErrNotEvent) {
					t.Fatalf("err %v, want ErrNotEvent", err)
				}
				return
			}
			if err != nil || e.Name() != tc.event {
				t.Fatalf("name %q, err %v; want %q", e.Name(), err, tc.event)
			}
		})
	}
}

func TestCommonFields(t *testing.T) {
	type want struct {
		comp   string
		hasC   bool
		layer  string
		hasL   bool
		ts     int64
		hasTS  bool
		dur    float64
		hasD   bool
		flops  float64
		hasF   bool
		badFor string // the accessor that must fail, "" none
	}
	for _, tc := range []struct {
		name, line string
		w          want
	}{
		{"all present", `{"event":"e","component_type":"mlp","layer_id":3,"timestamp":1795658836400000,"duration_us":41.5,"flops":1e6}`,
			want{comp: "mlp", hasC: true, layer: "3", hasL: true, ts: 1795658836400000, hasTS: true, dur: 41.5, hasD: true, flops: 1e6, hasF: true}},
		{"all absent", `{"event":"e"}`, want{}},
		{"nulls are absent", `{"event":"e","component_type":null,"layer_id":null,"timestamp":null,"duration_us":null,"flops":null}`, want{}},
		{"layer when layer_id is null", `{"event":"e","layer_id":null,"layer":"model.layers.0"}`, want{layer: "model.layers.0", hasL: true}},
		{"layer_id before layer", `{"layer":"x","event":"e","layer_id":"7"}`, want{layer: "7", hasL: true}},
		{"layer number as written", `{"event":"e","layer":2.50}`, want{layer: "2.50", hasL: true}},
		{"quoted timestamp", `{"event":"e","timestamp":"1704097842123456"}`, want{ts: 1704097842123456, hasTS: true}},
		{"timestamp in seconds", `{"event":"e","timestamp":1795658836.4}`, want{badFor: "timestamp"}},
		{"negative timestamp", `{"event":"e","timestamp":"-1"}`, want{badFor: "timestamp"}},
		{"component not a string", `{"event":"e","component_type":1}`, want{badFor: "component"}},
		{"layer an array", `{"event":"e","layer":[1]}`, want{badFor: "layer"}},
		{"negative duration", `{"event":"e","duration_us":-1}`, want{badFor: "duration"}},
		{"duration a string", `{"event":"e","duration_us":"fast"}`, want{badFor: "duration"}},
		{"flops past float64", `{"event":"e","flops":1e999}`, want{badFor: "flops"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Parse([]byte(tc.line))
			if err != nil {
				t.Fatal(err)
			}
			c, hasC, errC := e.Component()
			l, hasL, errL := e.Layer()
			ts, hasTS, errT := e.TimestampUS()
			d, hasD, errD := e.DurationUS()
			f, hasF, errF := e.FLOPs()
			for name, err := range map[string]error{"component": errC, "layer": errL, "timestamp": errT, "duration": errD, "flops": errF} {
				if (err != nil) != (name == tc.w.badFor) {
					t.Errorf("%s: err %v (want an error: %v)", name, err, name == tc.w.badFor)
				}
			}
			if tc.w.badFor != "" {
				return
			}
			got := want{comp: c, hasC: hasC, layer: l, hasL: hasL, ts: ts, hasTS: hasTS, dur: d, hasD: hasD, flops: f, hasF: hasF}
			if got != tc.w {
				t.Fatalf("got %+v\nwant %+v", got, tc.w)
			}
		})
	}
}

// reference reads the same fields by decoding into a map (exact keys, the last of a repeat
// wins): the oracle FuzzParse and the golden test hold the walk to.
type reference struct {
	m map[string]json.RawMessage
}

func decodeReference(b []byte) (reference, bool) {
	var m map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if dec.Decode(&m) != nil || m == nil {
		return reference{}, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return reference{}, false // more after the object
	}
	return reference{m}, true
}

func (r reference) str(key string) (string, bool) {
	var s string
	raw, ok := r.m[key]
	if !ok || json.Unmarshal(raw, &s) != nil || string(raw) == "null" {
		return "", false
	}
	return s, true
}

// FuzzParse: on any bytes Parse agrees with a decode into a map about whether they are an
// event and what its name, component and figures are; ParseValid agrees with Parse on
// every valid JSON value; neither panics.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"event":"compute_execution","component_type":"mlp","duration_us":1.5,"flops":65536,"layer_id":0,"timestamp":1}`,
		`{"event":"a","event":""}`, `{"\u0065vent":"x","component_type":null}`, `{"event":"x","flops":-0}`,
		`{"event":"x","layer":"1","layer_id":null}`, ` {"event" : "x" , "t":[1,{"a":"}"}]} `, `{"event":5}`, `[]`, `nul`,
	} {
		f.Add([]byte(s))
	}
	addGoldenSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Parse(b)
		ref, isObj := decodeReference(bytes.TrimSpace(b))
		name, hasName := ref.str("event")
		if wantOK := isObj && hasName && name != ""; (err == nil) != wantOK {
			t.Fatalf("Parse err %v; map decode: object %v, event %q", err, isObj, name)
		}
		if json.Valid(bytes.TrimSpace(b)) {
			ev, verr := ParseValid(bytes.TrimSpace(b))
			if (verr == nil) != (err == nil) || (err == nil && !reflect.DeepEqual(ev, e)) {
				t.Fatalf("ParseValid %+v, %v; Parse %+v, %v", ev, verr, e, err)
			}
		} else {
			_, _ = ParseValid(b) // must not panic
		}
		if err != nil {
			return
		}
		if e.Name() != name {
			t.Fatalf("name %q, map decode %q", e.Name(), name)
		}
		c, hasC, errC := e.Component()
		if raw, ok := ref.m["component_type"]; ok && string(raw) != "null" {
			rc, isStr := ref.str("component_type")
			if (errC == nil) != isStr || (isStr && (c != rc || !hasC)) {
				t.Fatalf("component %q %v %v; map decode %s", c, hasC, errC, raw)
			}
		} else if hasC || errC != nil {
			t.Fatalf("absent component read as %q %v", c, errC)
		}
		for key, get := range map[string]func() (float64, bool, error){"duration_us": e.DurationUS, "flops": e.FLOPs} {
			v, has, gerr := get()
			raw, ok := ref.m[key]
			if !ok || string(raw) == "null" {
				if has || gerr != nil {
					t.Fatalf("absent %s read as %v %v", key, v, gerr)
				}
				continue
			}
			var rv float64
			good := json.Unmarshal(raw, &rv) == nil && !math.IsInf(rv, 0) && rv >= 0
			if (gerr == nil) != good || (good && (v != rv || !has)) {
				t.Fatalf("%s %v %v %v; map decode %s", key, v, has, gerr, raw)
			}
		}
		if _, _, err := e.Layer(); err == nil {
			// A layer read must come from layer_id or layer as the map has them.
			l, has, _ := e.Layer()
			if has {
				lid, ok1 := ref.m["layer_id"]
				ly, ok2 := ref.m["layer"]
				if !(ok1 && string(lid) != "null") && !(ok2 && string(ly) != "null") {
					t.Fatalf("layer %q from an event with neither layer_id nor layer", l)
				}
			}
		}
		_, _, _ = e.TimestampUS()
	})
}

func addGoldenSeeds(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.jsonl"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no golden resource-event files in %s: %v", goldenDir, err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		// One line of each kind is enough to seed with.
		seen := map[string]bool{}
		for _, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
			ref, _ := decodeReference(l)
			if name, _ := ref.str("event"); !seen[name] {
				seen[name] = true
				f.Add(l)
			}
		}
	}
}

// TestGolden reads every line the Python builders wrote (testdata/resource_events) and
// requires each common field to read as a map decode reads it, with no error: the files
// are what strapd appends, so the daemon must read all of them. Each session's summary
// counts its events by name; the names read here must give the same counts.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.jsonl"))
	if err != nil || len(files) < 5 {
		t.Fatalf("golden resource-event files in %s: %v, %v", goldenDir, files, err)
	}
	// cases/: single events (seed 003's C API cases), checked line by line, not as sessions.
	cases, err := filepath.Glob(filepath.Join(goldenDir, "cases", "*.jsonl"))
	if err != nil || len(cases) == 0 {
		t.Fatalf("golden resource-event cases in %s/cases: %v, %v", goldenDir, cases, err)
	}
	session := map[string]bool{}
	for _, p := range files {
		session[p] = true
	}
	for _, p := range append(files, cases...) {
		t.Run(filepath.Base(p), func(t *testing.T) {
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			counts := map[string]int{}
			sc := bufio.NewScanner(f)
			sc.Buffer(nil, 1<<20)
			n := 0
			for sc.Scan() {
				n++
				line := sc.Bytes()
				e, err := Parse(line)
				if err != nil {
					t.Fatalf("line %d: %v", n, err)
				}
				ref, _ := decodeReference(line)
				name, _ := ref.str("event")
				if e.Name() != name {
					t.Fatalf("line %d: name %q, want %q", n, e.Name(), name)
				}
				if name == "resource_session_summary" {
					var sum struct {
						Events map[string]int `json:"events"`
					}
					if err := json.Unmarshal(line, &sum); err != nil {
						t.Fatal(err)
					}
					for k, c := range sum.Events {
						if counts[k] != c {
							t.Errorf("summary counts %d %s events, the lines before it %d", c, k, counts[k])
						}
					}
				}
				counts[name]++
				checkAgainstMap(t, n, &e, ref)
			}
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatal("no lines")
			}
			if !session[p] {
				return
			}
			if counts["resource_session_start"] != 1 || counts["resource_session_summary"] != 1 || len(counts) < 4 {
				t.Fatalf("%d lines, by event %v: not one whole monitor session", n, counts)
			}
		})
	}
}

func checkAgainstMap(t *testing.T, n int, e *Event, ref reference) {
	t.Helper()
	c, hasC, err := e.Component()
	if rc, ok := ref.str("component_type"); err != nil || c != rc || hasC != ok {
		t.Errorf("line %d: component %q %v %v, map %q", n, c, hasC, err, rc)
	}
	l, hasL, err := e.Layer()
	want, wantHas := "", false
	for _, k := range []string{"layer_id", "layer"} {
		if raw, ok := ref.m[k]; ok && string(raw) != "null" {
			want, wantHas = string(raw), true
			if s, ok := ref.str(k); ok {
				want = s
			}
			break
		}
	}
	if err != nil || l != want || hasL != wantHas {
		t.Errorf("line %d: layer %q %v %v, map %q %v", n, l, hasL, err, want, wantHas)
	}
	ts, hasTS, err := e.TimestampUS()
	if raw := ref.m["timestamp"]; err != nil || !hasTS || strconv.FormatInt(ts, 10) != string(raw) {
		t.Errorf("line %d: timestamp %d %v %v, map %s", n, ts, hasTS, err, raw)
	}
	for key, get := range map[string]func() (float64, bool, error){"duration_us": e.DurationUS, "flops": e.FLOPs} {
		v, has, err := get()
		raw, ok := ref.m[key]
		var rv float64
		if ok && string(raw) != "null" {
			if json.Unmarshal(raw, &rv) != nil {
				t.Fatalf("line %d: %s %s", n, key, raw)
			}
		} else {
			ok = false
		}
		if err != nil || has != ok || v != rv {
			t.Errorf("line %d: %s %v %v %v, map %s", n, key, v, has, err, raw)
		}
	}
}
