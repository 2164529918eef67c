package captureset

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
)

// rec is one packet a test stream holds: a TENSOR (float32 of shape), or a TOKEN.
type rec struct {
	name    string
	step    uint64
	forward uint64
	shape   []uint64
	meta    string
	token   bool
}

// writeStream writes a real v2 stream with the Go writer: the header metadata as strapd
// writes it (session, host, client_metadata), then recs, then END with status (none when
// status is "").
func writeStream(t testing.TB, path string, session uint64, host string, client map[string]any, recs []rec, status string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := stream.New(f, map[string]any{"strapd_version": "test", "session": session, "host": host, "client_metadata": client})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		p := stream.Packet{Name: r.name, Meta: []byte(r.meta)}
		p.Seq, p.Step, p.Forward = uint64(i+1), r.step, r.forward
		if r.token {
			p.Type = stream.TypeToken
			p.Name = ""
			p.Meta = []byte(fmt.Sprintf(`{"position":%d,"text":"t","token_id":%d}`, r.step, r.step))
		} else {
			n := uint64(1)
			for _, d := range r.shape {
				n *= d
			}
			payload := make([]byte, 4*n)
			for j := range payload {
				payload[j] = byte(j + i)
			}
			p.Type, p.DType, p.Shape, p.Codec = stream.TypeTensor, dtype.Float32, r.shape, codec.None
			p.RawLen, p.TensorLen = uint64(len(payload)), uint64(len(payload))
			p.Blocks = []stream.Block{{Data: payload}}
		}
		if err := w.WritePacket(&p); err != nil {
			t.Fatal(err)
		}
	}
	if status == "" {
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := w.Close(stream.EndInfo{Status: status}); err != nil {
		t.Fatal(err)
	}
}

// tpJob is a real two-rank tensor-parallel capture set on disk: rank 0 holds a replicated
// module and its half of a sharded one, rank 1 its half only; two tokens each. It returns
// the manifest (as a map, for tests to damage) and its path.
func tpJob(t testing.TB, dir string) (map[string]any, string) {
	t.Helper()
	layout := func(rank int) map[string]any {
		return map[string]any{"rank": rank, "world_size": 2, "local_rank": rank, "local_world_size": 2,
			"host": "node07", "source": "torch.distributed", "tp_rank": rank, "tp_size": 2, "pp_stage": 0,
			"pp_size": 1, "dp_rank": 0, "dp_size": 1, "layout_source": "argument",
			"modules": map[string]any{"model.h.0": map[string]any{"kind": "replicated"},
				"model.h.0.mlp.c_fc": map[string]any{"kind": "sharded", "axis": 2},
				// decided by its first output (a plain tensor: replicated, stored by tp rank 0)
				"model.h.1": map[string]any{"kind": "detect", "source": "default"}}}
	}
	shard := func(rank int) string {
		return fmt.Sprintf(`{"shard":{"axis":2,"offset":%d,"full_shape":[1,3,8],"tp_rank":%d,"tp_size":2}}`, 4*rank, rank)
	}
	var ranks []any
	for rank := range 2 {
		var recs []rec
		for fwd := range uint64(2) {
			if rank == 0 {
				recs = append(recs, rec{name: "model.h.0", step: fwd, forward: fwd, shape: []uint64{1, 3, 8}},
					rec{name: "model.h.1", step: fwd, forward: fwd, shape: []uint64{1, 3, 8}})
			}
			recs = append(recs, rec{name: "model.h.0.mlp.c_fc", step: fwd, forward: fwd, shape: []uint64{1, 3, 4}, meta: shard(rank)})
			recs = append(recs, rec{token: true, step: fwd})
		}
		name := fmt.Sprintf("cap.rank%05d-of-00002.strap", rank)
		path := filepath.Join(dir, name)
		fp := fmt.Sprintf("fp-%d", rank)
		writeStream(t, path, uint64(10+rank), "node07", map[string]any{"fingerprint": fp, "distributed": layout(rank)}, recs, "complete")
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		mods := map[string]any{"model.h.0.mlp.c_fc": map[string]any{"kind": "sharded", "axis": 2, "full_shape": []int{1, 3, 8}}}
		if rank == 0 {
			mods["model.h.0"] = map[string]any{"kind": "replicated"}
			mods["model.h.1"] = map[string]any{"kind": "replicated"}
		}
		ranks = append(ranks, map[string]any{"rank": rank, "local_rank": rank, "host": "node07",
			"tp_rank": rank, "pp_stage": 0, "dp_rank": 0, "stream": name, "session": 10 + rank,
			"strapd_host": "node07", "fingerprint": fp, "status": "complete", "tokens": []int{0, 2},
			"forwards": 2, "packets": len(recs), "bytes": st.Size(), "modules": mods})
	}
	m := map[string]any{"format": Format, "version": 1, "created": "2026-11-27T05:00:00Z", "job_id": "job-1",
		"world_size": 2, "layout": map[string]any{"tp_size": 2, "pp_size": 1, "dp_size": 1}, "ranks": ranks}
	mpath := filepath.Join(dir, "cap.capture-set.json")
	writeJSON(t, mpath, m)
	return m, mpath
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// clone deep-copies a manifest map through JSON, so a case can damage its own copy.
func clone(t testing.TB, m map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func rankOf(m map[string]any, i int) map[string]any {
	return m["ranks"].([]any)[i].(map[string]any)
}
