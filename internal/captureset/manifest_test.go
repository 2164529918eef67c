package captureset

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestParse: a manifest written per the D4 table parses; each damaged copy is refused with
// a problem naming the rank and the key.
func TestParse(t *testing.T) {
	good, path := tpJob(t, t.TempDir())
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(b)
	if err != nil {
		t.Fatalf("good manifest: %v", err)
	}
	if m.WorldSize != 2 || len(m.Ranks) != 2 || m.Layout != (Layout{2, 1, 1}) || m.JobID != "job-1" {
		t.Fatalf("parsed %+v", m)
	}
	r1 := m.Ranks[1]
	if r1.Rank != 1 || r1.TPRank != 1 || r1.Session != 11 || r1.Tokens != [2]uint64{0, 2} || *r1.LocalRank != 1 ||
		r1.Modules["model.h.0.mlp.c_fc"].Kind != KindSharded || *r1.Modules["model.h.0.mlp.c_fc"].Axis != 2 {
		t.Fatalf("rank 1 parsed as %+v", r1)
	}
	if _, ok := r1.Modules["model.h.0"]; ok {
		t.Fatal("rank 1 holds no replicated module")
	}

	for _, tc := range []struct {
		name   string
		damage func(m map[string]any)
		want   string // a substring of the error; "" with notManifest
		notMan bool
	}{
		{"unknown keys ignored", func(m map[string]any) { m["extra"] = 1; rankOf(m, 0)["more"] = []int{1} }, "", false},
		{"local_rank null", func(m map[string]any) { rankOf(m, 0)["local_rank"] = nil }, "", false},
		{"fingerprint null", func(m map[string]any) { rankOf(m, 0)["fingerprint"] = nil }, "", false},
		{"other format", func(m map[string]any) { m["format"] = "strap-other" }, "", true},
		{"no format", func(m map[string]any) { delete(m, "format") }, "", true},
		{"version 2", func(m map[string]any) { m["version"] = 2 }, "version: 2, this strapd reads version 1", false},
		{"version as text", func(m map[string]any) { m["version"] = "1" }, `version: "1" is not a non-negative integer`, false},
		{"created not RFC 3339", func(m map[string]any) { m["created"] = "yesterday" }, "created:", false},
		{"world_size 0", func(m map[string]any) { m["world_size"] = 0 }, "world_size: 0", false},
		{"missing rank", func(m map[string]any) { m["ranks"] = m["ranks"].([]any)[:1] }, "rank 1: ranks: no entry for this rank", false},
		{"world larger than the list", func(m map[string]any) { m["world_size"] = 1000000000000 },
			"ranks: 2 entries for world_size 1000000000000", false},
		{"rank listed twice", func(m map[string]any) { rankOf(m, 1)["rank"] = 0 }, "rank 0: rank: listed twice (ranks[0] and ranks[1])", false},
		{"not in rank order", func(m map[string]any) {
			r := m["ranks"].([]any)
			r[0], r[1] = r[1], r[0]
		}, "rank 1: rank: at ranks[0]: the list is not in rank order", false},
		{"rank outside the world", func(m map[string]any) { rankOf(m, 1)["rank"] = 2 }, "ranks[1].rank: 2 is outside a world of 2", false},
		{"negative rank", func(m map[string]any) { rankOf(m, 1)["rank"] = -1 }, "ranks[1].rank: -1 is not a non-negative integer", false},
		{"fractional rank", func(m map[string]any) { rankOf(m, 1)["rank"] = 1.5 }, "ranks[1].rank: 1.5 is not", false},
		{"layout product", func(m map[string]any) { m["layout"].(map[string]any)["dp_size"] = 2 }, "layout: tp_size 2 · pp_size 1 · dp_size 2 is not world_size 2", false},
		{"layout size 0", func(m map[string]any) { m["layout"].(map[string]any)["pp_size"] = 0 }, "each is at least 1", false},
		{"layout key missing", func(m map[string]any) { delete(m["layout"].(map[string]any), "tp_size") }, "layout.tp_size: missing", false},
		{"place filled twice", func(m map[string]any) { rankOf(m, 1)["tp_rank"] = 0 }, "rank 1: tp_rank/pp_stage/dp_rank: place (tp_rank 0, pp_stage 0, dp_rank 0) is rank 0's too", false},
		{"place outside the layout", func(m map[string]any) { rankOf(m, 1)["pp_stage"] = 1 }, "rank 1: pp_stage: 1 is not below layout.pp_size 1", false},
		{"missing key", func(m map[string]any) { delete(rankOf(m, 1), "session") }, "rank 1: session: missing", false},
		{"null where not allowed", func(m map[string]any) { rankOf(m, 0)["host"] = nil }, "rank 0: host: null", false},
		{"bad status", func(m map[string]any) { rankOf(m, 0)["status"] = "done" }, `rank 0: status: "done"`, false},
		{"role primary", func(m map[string]any) { rankOf(m, 1)["role"] = RolePrimary }, "", false},
		{"unknown role", func(m map[string]any) { rankOf(m, 1)["role"] = "leader" }, `rank 1: role: "leader", expected primary or replica`, false},
		{"role not text", func(m map[string]any) { rankOf(m, 1)["role"] = 1 }, "rank 1: role:", false},
		{"replica listing modules", func(m map[string]any) { rankOf(m, 1)["role"] = RoleReplica },
			"rank 1: role: replica, but modules names 1 (a replica stores no record)", false},
		{"tokens reversed", func(m map[string]any) { rankOf(m, 0)["tokens"] = []int{3, 1} }, "rank 0: tokens: [3, 1]: first after end", false},
		{"tokens not a pair", func(m map[string]any) { rankOf(m, 0)["tokens"] = []int{3} }, "rank 0: tokens: not a list", false},
		{"more tokens than packets", func(m map[string]any) { rankOf(m, 0)["tokens"] = []int{0, 100} }, "rank 0: tokens: [0, 100] holds more tokens than the 8 packets", false},
		{"module kind", func(m map[string]any) {
			rankOf(m, 0)["modules"].(map[string]any)["model.h.0"] = map[string]any{"kind": "mirrored"}
		}, `rank 0: modules.model.h.0.kind: "mirrored"`, false},
		{"sharded without axis", func(m map[string]any) {
			delete(rankOf(m, 1)["modules"].(map[string]any)["model.h.0.mlp.c_fc"].(map[string]any), "axis")
		}, "rank 1: modules.model.h.0.mlp.c_fc.axis: missing", false},
		{"axis outside the shape", func(m map[string]any) {
			rankOf(m, 1)["modules"].(map[string]any)["model.h.0.mlp.c_fc"].(map[string]any)["axis"] = 3
		}, "rank 1: modules.model.h.0.mlp.c_fc.axis: 3 outside a 3-dimensional full_shape", false},
		{"replicated with axis", func(m map[string]any) {
			rankOf(m, 0)["modules"].(map[string]any)["model.h.0"] = map[string]any{"kind": "replicated", "axis": 0}
		}, `rank 0: modules.model.h.0: kind "replicated" with axis`, false},
		{"stream empty", func(m map[string]any) { rankOf(m, 0)["stream"] = "" }, "rank 0: stream: empty", false},
		{"stream http", func(m map[string]any) { rankOf(m, 0)["stream"] = "https://x/cap.strap" }, "rank 0: stream: \"https://x/cap.strap\": only paths and s3:// URLs", false},
		{"ranks not a list", func(m map[string]any) { m["ranks"] = map[string]any{} }, "ranks: not a list", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := clone(t, good)
			tc.damage(m)
			b, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Parse(b)
			switch {
			case tc.notMan:
				if !errors.Is(err, ErrNotManifest) {
					t.Fatalf("want ErrNotManifest, got %v", err)
				}
			case tc.want == "":
				if err != nil {
					t.Fatalf("want it accepted: %v", err)
				}
			case err == nil:
				t.Fatalf("accepted; want %q", tc.want)
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not say %q", err, tc.want)
			default:
				var ie *InvalidError
				if !errors.As(err, &ie) || len(ie.Problems) == 0 {
					t.Fatalf("error %v is not an *InvalidError with problems", err)
				}
			}
		})
	}

	t.Run("not JSON", func(t *testing.T) {
		if _, err := Parse([]byte("STRAPSTM")); !errors.Is(err, ErrNotManifest) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		big := make([]byte, MaxSize+1)
		if _, err := Parse(big); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("lone surrogate", func(t *testing.T) {
		m := clone(t, good)
		b, _ := json.Marshal(m)
		b = []byte(strings.Replace(string(b), `"job-1"`, `"job-\udcff"`, 1))
		if _, err := Parse(b); err == nil || !strings.Contains(err.Error(), "text:") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestSniff(t *testing.T) {
	for in, want := range map[string]bool{
		`{"format":"strap-capture-set","version":1}`: true,
		`{"format":"strap-capture-set"`:              false,
		`{"format":"other"}`:                         false,
		`{"format":1}`:                               false,
		`[]`:                                         false,
		"STRAPSTM\x02\x00":                           false,
	} {
		if got := Sniff([]byte(in)); got != want {
			t.Errorf("Sniff(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestLocate(t *testing.T) {
	for _, tc := range []struct{ manifest, stream, want, err string }{
		{"/data/run/cap.capture-set.json", "cap.rank00001-of-00002.strap", "/data/run/cap.rank00001-of-00002.strap", ""},
		{"run/cap.capture-set.json", "../other/cap.strap", "other/cap.strap", ""},
		{"cap.capture-set.json", "cap.strap", "cap.strap", ""},
		{"/data/run/cap.capture-set.json", "/elsewhere/cap.strap", "/elsewhere/cap.strap", ""},
		{"/data/run/cap.capture-set.json", "s3://caps/run1/cap.strap", "s3://caps/run1/cap.strap", ""},
		{"s3://caps/run1/cap.capture-set.json", "cap.rank00000-of-00002.strap", "s3://caps/run1/cap.rank00000-of-00002.strap", ""},
		{"s3://caps/run1/cap.capture-set.json", "../run0/cap.strap", "s3://caps/run0/cap.strap", ""},
		{"s3://caps/cap.capture-set.json", "../cap.strap", "", "leaves the bucket"},
		{"s3://caps/run1/cap.capture-set.json", "/abs/cap.strap", "/abs/cap.strap", ""},
		{"/data/cap.capture-set.json", "file:///data/cap.strap", "", "only paths and s3:// URLs"},
		{"/data/cap.capture-set.json", "", "", "empty"},
	} {
		got, err := Locate(tc.manifest, tc.stream)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Locate(%q, %q) = %q, %v; want error %q", tc.manifest, tc.stream, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Locate(%q, %q) = %q, %v; want %q", tc.manifest, tc.stream, got, err, tc.want)
		}
	}
}
