package captureset

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// seeds are the manifests in testdata/: a tensor-parallel pair, a pipeline × data layout
// over two hosts with every kind of stream location, a single process, and a vLLM engine's
// two workers (tp rank 1 stores nothing: no module, no packet).
func seeds(t testing.TB) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil || len(paths) < 3 {
		t.Fatalf("seed manifests in testdata: %v %v", paths, err)
	}
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(p)] = b
	}
	return out
}

// TestSeeds: every seed is a valid manifest (so the fuzzer starts from accepted input).
func TestSeeds(t *testing.T) {
	for name, b := range seeds(t) {
		if _, err := Parse(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzParse treats arbitrary bytes as a manifest read from disk: Parse never panics, and
// whatever it accepts keeps D4's promises (one entry per rank in rank order, the layout
// filled exactly once, token ranges ordered, sharded modules with an axis inside their
// full shape, stream locations that resolve) and survives a write and a second read
// unchanged.
func FuzzParse(f *testing.F) {
	for _, b := range seeds(f) {
		f.Add(b)
	}
	f.Add([]byte(`{"format":"strap-capture-set","version":1,"world_size":18446744073709551615,"ranks":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		if !Sniff(data) {
			t.Fatal("Parse accepted what Sniff does not call a manifest")
		}
		l := m.Layout
		if m.WorldSize < 1 || len(m.Ranks) != m.WorldSize || l.TPSize*l.PPSize*l.DPSize != m.WorldSize {
			t.Fatalf("world %d, %d ranks, layout %+v", m.WorldSize, len(m.Ranks), l)
		}
		places := map[[3]int]bool{}
		for i, r := range m.Ranks {
			if r.Rank != i {
				t.Fatalf("entry %d is rank %d", i, r.Rank)
			}
			p := [3]int{r.TPRank, r.PPStage, r.DPRank}
			if r.TPRank < 0 || r.TPRank >= l.TPSize || r.PPStage < 0 || r.PPStage >= l.PPSize || r.DPRank < 0 || r.DPRank >= l.DPSize || places[p] {
				t.Fatalf("rank %d at place %v (layout %+v)", i, p, l)
			}
			places[p] = true
			if r.Tokens[0] > r.Tokens[1] {
				t.Fatalf("rank %d tokens %v", i, r.Tokens)
			}
			for name, mod := range r.Modules {
				switch mod.Kind {
				case KindSharded:
					if mod.Axis == nil || *mod.Axis < 0 || *mod.Axis >= len(mod.FullShape) {
						t.Fatalf("rank %d module %q: %+v", i, name, mod)
					}
				case KindLocal, KindReplicated:
					if mod.Axis != nil || mod.FullShape != nil {
						t.Fatalf("rank %d module %q: %+v", i, name, mod)
					}
				default:
					t.Fatalf("rank %d module %q kind %q", i, name, mod.Kind)
				}
			}
			if _, err := Locate("/data/cap.capture-set.json", r.Stream); err != nil {
				t.Fatalf("rank %d stream %q: %v", i, r.Stream, err)
			}
			_, _ = Locate("s3://b/k/cap.capture-set.json", r.Stream) // may refuse "..": must not panic
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Parse(again)
		if err != nil {
			t.Fatalf("written back, not read again: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the manifest:\n%+v\n%+v", m, m2)
		}
	})
}

// FuzzReadFacts treats arbitrary bytes as a rank's stream: the facts walk never panics, and
// what it reports is consistent (a token range inside the packets counted, the file's size).
// Seeds: the two streams of a real tensor-parallel set (tpJob), and the golden sets' streams,
// which the Python client wrote through strapd (testdata/capture-set).
func FuzzReadFacts(f *testing.F) {
	dir := f.TempDir()
	tpJob(f, dir)
	paths, _ := filepath.Glob(filepath.Join(dir, "*.strap"))
	golden, _ := filepath.Glob(filepath.Join(goldenDir, "*", "*.strap"))
	if len(golden) == 0 {
		f.Fatal("no golden streams in " + goldenDir)
	}
	paths = append(paths, golden...)
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		facts, err := ReadFacts(bytesReaderAt(data), int64(len(data)))
		if err != nil {
			return
		}
		if facts.Bytes != uint64(len(data)) || facts.Tokens[0] > facts.Tokens[1] {
			t.Fatalf("facts %+v of %d bytes", facts, len(data))
		}
		for name, m := range facts.Modules {
			if m.Kind != KindLocal && m.Kind != KindReplicated && m.Kind != KindSharded {
				t.Fatalf("module %q kind %q", name, m.Kind)
			}
		}
	})
}

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
