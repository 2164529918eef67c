package captureset

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fileOpener opens local files (cmd/strapd's opener adds s3://).
func fileOpener(_ context.Context, loc string, _ int64) (io.ReaderAt, int64, func(), func() error, error) {
	f, err := os.Open(loc)
	if err != nil {
		return nil, 0, nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, nil, nil, err
	}
	return f, st.Size(), func() { f.Close() }, func() error { return nil }, nil
}

func verifyManifest(t *testing.T, path string) *SetReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(b)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return VerifySet(context.Background(), m, path, fileOpener)
}

// TestVerifySet: a real two-rank tensor-parallel set on disk verifies; each damage to the
// manifest or to a stream is found and names the rank and the key.
func TestVerifySet(t *testing.T) {
	dir := t.TempDir()
	good, mpath := tpJob(t, dir)
	rep := verifyManifest(t, mpath)
	if !rep.OK || len(rep.Ranks) != 2 {
		t.Fatalf("good set: %+v", rep)
	}
	for _, rr := range rep.Ranks {
		if !rr.OK || rr.Verify == nil || !rr.Verify.OK || rr.Stream != filepath.Join(dir, fmt.Sprintf("cap.rank%05d-of-00002.strap", rr.Rank)) {
			t.Fatalf("rank %d: %+v", rr.Rank, rr)
		}
	}

	// The streams themselves, damaged after the manifest was written.
	stream1 := filepath.Join(dir, "cap.rank00001-of-00002.strap")
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, m map[string]any, dir string)
		want   []string // each a substring of one problem
	}{
		{"wrong session", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 1)["session"] = 99 },
			[]string{"rank 1: session: manifest 99, stream header 11"}},
		{"wrong rank stream", func(t *testing.T, m map[string]any, _ string) {
			rankOf(m, 1)["stream"] = "cap.rank00000-of-00002.strap"
		}, []string{"rank 1: rank: manifest 1, stream header 0", "rank 1: session: manifest 11, stream header 10"}},
		{"stream missing", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 0)["stream"] = "gone.strap" },
			[]string{"rank 0: stream: open " + filepath.Join(dir, "gone.strap")}},
		{"packet count", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 0)["packets"] = 7 },
			[]string{"rank 0: packets: manifest 7, stream 8"}},
		{"token range", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 1)["tokens"] = []int{1, 3} },
			[]string{"rank 1: tokens: manifest [1, 3), stream [0, 2)"}},
		{"forwards", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 1)["forwards"] = 3 },
			[]string{"rank 1: forwards: manifest 3, stream 2"}},
		{"status", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 0)["status"] = "aborted" },
			[]string{`rank 0: status: manifest "aborted", stream "complete"`}},
		{"bytes", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 0)["bytes"] = 1 },
			[]string{"rank 0: bytes: manifest 1, stream "}},
		{"host", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 0)["host"] = "node08" },
			[]string{`rank 0: host: manifest "node08", stream header "node07"`}},
		{"strapd host", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 0)["strapd_host"] = "node08" },
			[]string{`rank 0: strapd_host: manifest "node08", stream header "node07"`}},
		{"fingerprint", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 0)["fingerprint"] = nil },
			[]string{`rank 0: fingerprint: manifest null, stream header "fp-0"`}},
		{"local rank", func(t *testing.T, m map[string]any, _ string) { rankOf(m, 1)["local_rank"] = nil },
			[]string{"rank 1: local_rank: manifest null, stream header 1"}},
		{"places swapped", func(t *testing.T, m map[string]any, _ string) {
			rankOf(m, 0)["tp_rank"], rankOf(m, 1)["tp_rank"] = 1, 0
		}, []string{"rank 0: tp_rank: manifest 1, stream header 0", "rank 1: tp_rank: manifest 0, stream header 1"}},
		{"module not held", func(t *testing.T, m map[string]any, _ string) {
			rankOf(m, 1)["modules"].(map[string]any)["model.h.0"] = map[string]any{"kind": "replicated"}
		}, []string{"rank 1: modules.model.h.0: listed, but the stream has no record of it"}},
		{"module not listed", func(t *testing.T, m map[string]any, _ string) {
			delete(rankOf(m, 0)["modules"].(map[string]any), "model.h.0")
		}, []string{"rank 0: modules.model.h.0: the stream has records of it, the manifest does not list it"}},
		{"sharded said local", func(t *testing.T, m map[string]any, _ string) {
			rankOf(m, 1)["modules"].(map[string]any)["model.h.0.mlp.c_fc"] = map[string]any{"kind": "local"}
		}, []string{`rank 1: modules.model.h.0.mlp.c_fc: kind: manifest "local", stream records "sharded"`}},
		{"replicated said local", func(t *testing.T, m map[string]any, _ string) {
			rankOf(m, 0)["modules"].(map[string]any)["model.h.0"] = map[string]any{"kind": "local"}
		}, []string{`rank 0: modules.model.h.0: kind: manifest "local", stream "replicated"`}},
		{"a detected module (plain records) listed local", func(_ *testing.T, m map[string]any, _ string) {
			rankOf(m, 0)["modules"].(map[string]any)["model.h.1"] = map[string]any{"kind": "local"}
		}, []string{`rank 0: modules.model.h.1: kind: manifest "local", stream "replicated"`}},
		{"full shape", func(t *testing.T, m map[string]any, _ string) {
			rankOf(m, 0)["modules"].(map[string]any)["model.h.0.mlp.c_fc"].(map[string]any)["full_shape"] = []int{1, 3, 9}
		}, []string{"rank 0: modules.model.h.0.mlp.c_fc: full_shape: manifest [1 3 9], first stream record [1 3 8]"}},
		{"stream moved (absolute path)", func(t *testing.T, m map[string]any, dir string) {
			moved := filepath.Join(t.TempDir(), "r1.strap")
			if err := os.Rename(stream1, moved); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Rename(moved, stream1) })
			rankOf(m, 1)["stream"] = moved
		}, nil},
		{"stream damaged", func(t *testing.T, m map[string]any, _ string) {
			b, err := os.ReadFile(stream1)
			if err != nil {
				t.Fatal(err)
			}
			orig := append([]byte(nil), b...)
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(stream1, b, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.WriteFile(stream1, orig, 0o644) })
		}, []string{"rank 1: stream: " + stream1 + " does not verify"}},
		{"stream cut", func(t *testing.T, m map[string]any, _ string) {
			b, err := os.ReadFile(stream1)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(stream1, b[:len(b)*2/3], 0o644); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.WriteFile(stream1, b, 0o644) })
		}, []string{"rank 1: stream: " + stream1 + " does not verify", `rank 1: status: manifest "complete", stream "open"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := clone(t, good)
			tc.damage(t, m, dir)
			path := filepath.Join(dir, "case.capture-set.json")
			writeJSON(t, path, m)
			rep := verifyManifest(t, path)
			var all []string
			for _, rr := range rep.Ranks {
				for _, p := range rr.Problems {
					all = append(all, p.String())
				}
			}
			if len(tc.want) == 0 {
				if !rep.OK {
					t.Fatalf("want OK, got:\n%s", strings.Join(all, "\n"))
				}
				return
			}
			if rep.OK {
				t.Fatal("verified OK")
			}
			for _, w := range tc.want {
				found := false
				for _, p := range all {
					found = found || strings.Contains(p, w)
				}
				if !found {
					t.Errorf("no problem says %q; problems:\n%s", w, strings.Join(all, "\n"))
				}
			}
		})
	}
}

// TestReadFactsSingleProcess: a capture set of one process (no distributed object in the
// header) checks against rank 0; a stream that is still open reads as status "open".
func TestReadFactsSingleProcess(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "one.strap")
	writeStream(t, path, 3, "h", map[string]any{"fingerprint": "fp"}, []rec{
		{name: "a", step: 5, forward: 7, shape: []uint64{2}}, {token: true, step: 5}, {token: true, step: 6}}, "")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	facts, err := ReadFacts(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	if facts.Status != StatusOpen || facts.Tokens != [2]uint64{5, 7} || facts.Forwards != 8 || facts.Packets != 3 ||
		facts.Distributed != nil || facts.Modules["a"].Kind != KindLocal || facts.Session != 3 {
		t.Fatalf("facts %+v", facts)
	}
	fp := "fp"
	m := &Manifest{WorldSize: 1, Layout: Layout{1, 1, 1}}
	e := &Rank{Rank: 0, Session: 3, StrapdHost: "h", Fingerprint: &fp, Status: StatusOpen, Tokens: [2]uint64{5, 7},
		Forwards: 8, Packets: 3, Bytes: uint64(st.Size()), Modules: map[string]Module{"a": {Kind: KindLocal}}}
	if ps := Compare(m, e, facts); len(ps) != 0 {
		t.Fatalf("problems: %v", ps)
	}
	m.WorldSize = 2
	if ps := Compare(m, e, facts); len(ps) != 1 || ps[0].Key != "rank" {
		t.Fatalf("a single process's stream in a world of 2: %v", ps)
	}
}

// TestVerifySetRankStoringNothing: a tensor-parallel rank whose outputs are all replicated
// (stored by tp rank 0; a vLLM engine's tp ranks > 0) still has a stream, with its header and
// no record: its entry lists no module, 0 packets, tokens [0, 0), 0 forwards, and the set
// verifies (docs/DISTRIBUTED.md D4). The same entry listing a module, or counting a packet,
// or its stream gone, fails naming rank 1.
func TestVerifySetRankStoringNothing(t *testing.T) {
	dir := t.TempDir()
	dist := func(rank int) map[string]any {
		return map[string]any{"rank": rank, "world_size": 2, "local_rank": rank, "local_world_size": nil,
			"host": "node07", "source": "torch.distributed", "tp_rank": rank, "tp_size": 2, "pp_stage": 0,
			"pp_size": 1, "dp_rank": 0, "dp_size": 1, "layout_source": "vllm", "job_id": "vllm-x",
			"replicated": "tp_rank0", "modules": map[string]any{
				"vllm.rows":      map[string]any{"kind": "replicated", "source": "vllm"},
				"model.layers.0": map[string]any{"kind": "replicated", "source": "vllm"}}}
	}
	var ranks []any
	for rank := range 2 {
		var recs []rec
		if rank == 0 {
			recs = []rec{{name: "vllm.rows", shape: []uint64{3, 2}}, {name: "model.layers.0", shape: []uint64{3, 8}},
				{token: true, step: 0}}
		}
		name := fmt.Sprintf("vllm-x.rank%05d-of-00002.strap", rank)
		path := filepath.Join(dir, name)
		writeStream(t, path, uint64(20+rank), "node07", map[string]any{"fingerprint": "fp", "distributed": dist(rank)}, recs, "complete")
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		mods, tokens, fwds := map[string]any{}, []int{0, 0}, 0
		if rank == 0 {
			mods = map[string]any{"vllm.rows": map[string]any{"kind": "replicated"},
				"model.layers.0": map[string]any{"kind": "replicated"}}
			tokens, fwds = []int{0, 1}, 1
		}
		role := RolePrimary
		if rank > 0 {
			role = RoleReplica
		}
		ranks = append(ranks, map[string]any{"rank": rank, "local_rank": rank, "host": "node07",
			"tp_rank": rank, "pp_stage": 0, "dp_rank": 0, "role": role, "stream": name, "session": 20 + rank,
			"strapd_host": "node07", "fingerprint": "fp", "status": "complete", "tokens": tokens,
			"forwards": fwds, "packets": len(recs), "bytes": st.Size(), "modules": mods})
	}
	good := map[string]any{"format": Format, "version": 1, "created": "2026-12-06T20:00:00Z", "job_id": "vllm-x",
		"world_size": 2, "layout": map[string]any{"tp_size": 2, "pp_size": 1, "dp_size": 1}, "ranks": ranks}
	for _, tc := range []struct {
		name   string
		damage func(m map[string]any)
		want   string
	}{
		{"verifies", func(map[string]any) {}, ""},
		// a manifest written before the role key: the header alone says what rank 1 is
		{"verifies without roles", func(m map[string]any) { delete(rankOf(m, 0), "role"); delete(rankOf(m, 1), "role") }, ""},
		{"a replica called primary", func(m map[string]any) { rankOf(m, 1)["role"] = RolePrimary },
			`rank 1: role: manifest "primary", stream header "replica"`},
		{"tp rank 0 called a replica", func(m map[string]any) {
			rankOf(m, 0)["role"] = RoleReplica
			rankOf(m, 0)["modules"] = map[string]any{}
		}, `rank 0: role: manifest "replica", stream header "primary"`},
		{"lists a module", func(m map[string]any) {
			delete(rankOf(m, 1), "role") // with it, Parse refuses a replica listing modules (TestParse)
			rankOf(m, 1)["modules"] = map[string]any{"model.layers.0": map[string]any{"kind": "replicated"}}
		}, "rank 1: modules.model.layers.0: listed, but the stream has no record of it"},
		{"counts a packet", func(m map[string]any) { rankOf(m, 1)["packets"] = 1 }, "rank 1: packets: manifest 1, stream 0"},
		{"stream gone", func(m map[string]any) { rankOf(m, 1)["stream"] = "gone.strap" }, "rank 1: stream: open "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := clone(t, good)
			tc.damage(m)
			path := filepath.Join(dir, "vllm-x.capture-set.json")
			writeJSON(t, path, m)
			rep := verifyManifest(t, path)
			var all []string
			for _, rr := range rep.Ranks {
				for _, p := range rr.Problems {
					all = append(all, p.String())
				}
			}
			if tc.want == "" {
				if !rep.OK || len(rep.Ranks) != 2 {
					t.Fatalf("want OK, got:\n%s", strings.Join(all, "\n"))
				}
				return
			}
			if rep.OK || !strings.Contains(strings.Join(all, "\n"), tc.want) {
				t.Fatalf("want a problem %q, got OK=%v:\n%s", tc.want, rep.OK, strings.Join(all, "\n"))
			}
		})
	}
	// A rank storing nothing is still a rank: leaving it out of the manifest is refused.
	m := clone(t, good)
	m["ranks"] = m["ranks"].([]any)[:1]
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(b); err == nil || !strings.Contains(err.Error(), "ranks: 1 entries for world_size 2") {
		t.Fatalf("a manifest without rank 1: %v", err)
	}
}

// TestRoleOf: the header rule of a rank's role (D4), the one capture_set.rank_role applies.
func TestRoleOf(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	s := func(v string) *string { return &v }
	type mods = map[string]struct {
		Kind string `json:"kind"`
		Axis *int   `json:"axis"`
	}
	rep := mods{"a": {Kind: KindReplicated}, "b": {Kind: KindReplicated}}
	for _, tc := range []struct {
		name string
		d    *Distributed
		want string
	}{
		{"one process", nil, RolePrimary},
		{"tp rank 1, all replicated", &Distributed{TPRank: u(1), Replicated: s("tp_rank0"), Modules: rep}, RoleReplica},
		{"tp rank 0", &Distributed{TPRank: u(0), Replicated: s("tp_rank0"), Modules: rep}, RolePrimary},
		{"no tp rank", &Distributed{Replicated: s("tp_rank0"), Modules: rep}, RolePrimary},
		{"every rank stores", &Distributed{TPRank: u(1), Replicated: s("all"), Modules: rep}, RolePrimary},
		{"no replicated key", &Distributed{TPRank: u(1), Modules: rep}, RolePrimary},
		{"no modules", &Distributed{TPRank: u(1), Replicated: s("tp_rank0")}, RolePrimary},
		{"a sharded module", &Distributed{TPRank: u(1), Replicated: s("tp_rank0"),
			Modules: mods{"a": {Kind: KindReplicated}, "b": {Kind: KindSharded}}}, RolePrimary},
		{"a module decided later", &Distributed{TPRank: u(1), Replicated: s("tp_rank0"),
			Modules: mods{"a": {Kind: KindReplicated}, "b": {Kind: kindDetect}}}, RolePrimary},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RoleOf(tc.d); got != tc.want {
				t.Fatalf("RoleOf = %q, want %q", got, tc.want)
			}
		})
	}
}
