package captureset

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// goldenDir holds real capture sets written by the Python client through strapd, with the
// facts every reader must find in them (testdata/capture-set/README.md); the Python client's
// tests (tests/test_capture_set_golden.py) read the same files.
const goldenDir = "../../testdata/capture-set"

// goldenExpect is expect.json; its ranks are manifest rank entries without "stream" (a Rank with Stream empty).
type goldenExpect struct {
	Version int `json:"version"`
	Sets    map[string]struct {
		Manifest  string          `json:"manifest"`
		WorldSize int             `json:"world_size"`
		Layout    Layout          `json:"layout"`
		JobID     string          `json:"job_id"`
		Ranks     map[string]Rank `json:"ranks"`
	} `json:"sets"`
	Bad map[string]struct {
		Rank *int   `json:"rank"`
		Key  string `json:"key"`
	} `json:"bad"`
}

func readGolden(t *testing.T) goldenExpect {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(goldenDir, "expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g goldenExpect
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		t.Fatalf("expect.json: %v", err)
	}
	if g.Version != 1 {
		t.Fatalf("expect.json version %d, this test reads 1", g.Version)
	}
	return g
}

func u64(p *uint64) *int {
	if p == nil {
		return nil
	}
	v := int(*p)
	return &v
}

// TestGoldenFacts: ReadFacts finds in each golden stream the facts expect.json names (the
// ones the Python client's rank_entry finds too), the manifest parses to the same set, and
// Compare finds nothing wrong between them.
func TestGoldenFacts(t *testing.T) {
	g := readGolden(t)
	if len(g.Sets) == 0 {
		t.Fatal("expect.json names no set")
	}
	for name, set := range g.Sets {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(goldenDir, name)
			b, err := os.ReadFile(filepath.Join(dir, set.Manifest))
			if err != nil {
				t.Fatal(err)
			}
			m, err := Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			if m.WorldSize != set.WorldSize || m.Layout != set.Layout || m.JobID != set.JobID {
				t.Errorf("manifest: world %d layout %+v job %q; expect.json %d %+v %q", m.WorldSize, m.Layout,
					m.JobID, set.WorldSize, set.Layout, set.JobID)
			}
			streams, _ := filepath.Glob(filepath.Join(dir, "*.strap"))
			var names []string
			for _, s := range streams {
				names = append(names, filepath.Base(s))
			}
			var want []string
			for s := range set.Ranks {
				want = append(want, s)
			}
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Fatalf("streams %v, expect.json names %v", names, want)
			}
			for _, e := range m.Ranks {
				exp, ok := set.Ranks[e.Stream]
				if !ok {
					t.Fatalf("rank %d: stream %s not in expect.json", e.Rank, e.Stream)
				}
				f, err := os.Open(filepath.Join(dir, e.Stream))
				if err != nil {
					t.Fatal(err)
				}
				st, _ := f.Stat()
				facts, err := ReadFacts(f, st.Size())
				f.Close()
				if err != nil {
					t.Fatalf("%s: %v", e.Stream, err)
				}
				if facts.Error != "" || len(facts.Mixed) > 0 || facts.Distributed == nil {
					t.Fatalf("%s: walk error %q, mixed %v, distributed %v", e.Stream, facts.Error, facts.Mixed, facts.Distributed)
				}
				d := facts.Distributed
				host := ""
				if d.Host != nil {
					host = *d.Host
				}
				got := Rank{Rank: *u64(d.Rank), LocalRank: u64(d.LocalRank), Host: host,
					TPRank: *u64(d.TPRank), PPStage: *u64(d.PPStage), DPRank: *u64(d.DPRank), Role: facts.Role,
					Session: facts.Session, StrapdHost: facts.StrapdHost, Fingerprint: facts.Fingerprint,
					Status: facts.Status, Tokens: facts.Tokens, Forwards: facts.Forwards, Packets: facts.Packets,
					Bytes: facts.Bytes, Modules: facts.Modules}
				if !reflect.DeepEqual(got, exp) {
					gb, _ := json.Marshal(got)
					eb, _ := json.Marshal(exp)
					t.Errorf("%s: facts\n got %s\nwant %s", e.Stream, gb, eb)
				}
				if ps := Compare(m, &e, facts); len(ps) > 0 {
					t.Errorf("%s: Compare: %v", e.Stream, ps)
				}
			}
		})
	}
}

// TestGoldenBadManifests: each damaged manifest is refused by Parse, or by Compare against
// its streams, with a problem naming the rank and key expect.json gives (the Python client's
// check names the same).
func TestGoldenBadManifests(t *testing.T) {
	g := readGolden(t)
	if len(g.Bad) == 0 {
		t.Fatal("expect.json names no bad manifest")
	}
	for name, want := range g.Bad {
		t.Run(name, func(t *testing.T) {
			wantRank := -1
			if want.Rank != nil {
				wantRank = *want.Rank
			}
			path := filepath.Join(goldenDir, name)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var ps []Problem
			m, err := Parse(b)
			var inv *InvalidError
			switch {
			case errors.As(err, &inv):
				ps = inv.Problems
			case err != nil:
				t.Fatalf("Parse: %v (want a problem list)", err)
			default:
				for _, e := range m.Ranks {
					f, err := os.Open(filepath.Join(filepath.Dir(path), e.Stream))
					if err != nil {
						t.Fatal(err)
					}
					st, _ := f.Stat()
					facts, err := ReadFacts(f, st.Size())
					f.Close()
					if err != nil {
						t.Fatal(err)
					}
					ps = append(ps, Compare(m, &e, facts)...)
				}
			}
			if !slices.ContainsFunc(ps, func(p Problem) bool { return p.Rank == wantRank && p.Key == want.Key }) {
				t.Errorf("problems %v name no (rank %d, key %q)", ps, wantRank, want.Key)
			}
		})
	}
}
