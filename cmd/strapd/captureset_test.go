package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/strap-llm/strap/internal/captureset"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

// rankCapture is one rank's capture through a real strapd: what the test knows of it to
// write the manifest.
type rankCapture struct {
	path    string
	session uint64
	packets int
}

// captureRank streams a tensor-parallel rank's records through the strapd on sock: per
// forward pass, on tp_rank 0 the replicated "model.h.0" (1×3×8), on every rank its half of
// the column-parallel "model.h.0.mlp.c_fc" (1×3×4 of 1×3×8) with its shard descriptor, and
// a TOKEN. The OPEN metadata carries the distributed object as the Python client writes it.
func captureRank(t *testing.T, sock, out string, rank int, host string, forwards int) rankCapture {
	t.Helper()
	c := dialRetry(t, sock)
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dist := map[string]any{"rank": rank, "world_size": 2, "local_rank": 0, "local_world_size": 1, "host": host,
		"source": "env", "tp_rank": rank, "tp_size": 2, "pp_stage": 0, "pp_size": 1, "dp_rank": 0, "dp_size": 1,
		"layout_source": "argument", "modules": map[string]any{"model.h.0": map[string]any{"kind": "replicated"},
			"model.h.0.mlp.c_fc": map[string]any{"kind": "sharded", "axis": 2}}}
	st, opened, err := controltest.OpenStream(c, shm.HeaderSize+256<<10, f, control.Open{Codec: "zstd", Policy: "block",
		Metadata: map[string]any{"model_class": "TPTest", "output_path": out, "fingerprint": fmt.Sprintf("fp-%d", rank), "distributed": dist}})
	if err != nil {
		t.Fatal(err)
	}
	rc := rankCapture{path: out, session: opened.Session}
	for fwd := range forwards {
		if rank == 0 {
			tn := shm.Tensor{Name: "model.h.0", DType: dtype.Float32, Shape: []uint64{1, 3, 8}, Step: uint64(fwd),
				Forward: uint64(fwd), Payload: pipelinetest.Activations(uint64(fwd+1), 24)}
			if err := st.Put(&tn); err != nil {
				t.Fatal(err)
			}
			rc.packets++
		}
		tn := shm.Tensor{Name: "model.h.0.mlp.c_fc", DType: dtype.Float32, Shape: []uint64{1, 3, 4}, Step: uint64(fwd),
			Forward: uint64(fwd), Payload: pipelinetest.Activations(uint64(100*rank+fwd+1), 12),
			Meta: []byte(fmt.Sprintf(`{"shard":{"axis":2,"offset":%d,"full_shape":[1,3,8],"tp_rank":%d,"tp_size":2}}`, 4*rank, rank))}
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
		if err := c.Token(control.Token{Seq: st.P.TakeSeq(), Index: uint64(fwd), TokenID: int64(fwd)}); err != nil {
			t.Fatal(err)
		}
		rc.packets += 2
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	return rc
}

// manifestFor writes a capture-set manifest per the D4 table from what the test sent.
func manifestFor(t *testing.T, caps []rankCapture, streams []string, hosts []string, forwards int) map[string]any {
	t.Helper()
	strapdHost, _ := os.Hostname()
	var ranks []any
	for r, rc := range caps {
		st, err := os.Stat(rc.path)
		if err != nil {
			t.Fatal(err)
		}
		mods := map[string]any{"model.h.0.mlp.c_fc": map[string]any{"kind": "sharded", "axis": 2, "full_shape": []int{1, 3, 8}}}
		if r == 0 {
			mods["model.h.0"] = map[string]any{"kind": "replicated"}
		}
		ranks = append(ranks, map[string]any{"rank": r, "local_rank": 0, "host": hosts[r], "tp_rank": r, "pp_stage": 0,
			"dp_rank": 0, "stream": streams[r], "session": rc.session, "strapd_host": strapdHost,
			"fingerprint": fmt.Sprintf("fp-%d", r), "status": "complete", "tokens": []int{0, forwards}, "forwards": forwards,
			"packets": rc.packets, "bytes": st.Size(), "modules": mods})
	}
	return map[string]any{"format": "strap-capture-set", "version": 1, "created": "2026-11-27T05:00:00Z",
		"job_id": "tp-job", "world_size": 2, "layout": map[string]any{"tp_size": 2, "pp_size": 1, "dp_size": 1}, "ranks": ranks}
}

func writeManifest(t *testing.T, path string, m map[string]any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func copyManifest(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(m)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// runStrapd runs the binary and returns its exit status, stdout and stderr.
func runStrapd(t *testing.T, bin string, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// TestCaptureSetInspectVerify: one tensor-parallel job of two ranks, each served by its own
// strapd (two "hosts": separate sockets and output directories), and a manifest written per
// DISTRIBUTED.md D4 beside rank 0's stream (rank 1's by absolute path). `strapd inspect`
// prints it (text and JSON, recognised by content under any name); `strapd verify` passes,
// and fails with exit 2 naming the rank and the key for each damage: a wrong session, a
// missing rank, a place taken twice, a stream missing, a packet count that disagrees.
func TestCaptureSetInspectVerify(t *testing.T) {
	bin := strapdBinary(t)
	const forwards = 3
	hosts := []string{"node-a", "node-b"}
	var caps []rankCapture
	dirs := make([]string, 2)
	for r := range 2 {
		dirs[r] = shortDir(t)
		sock := filepath.Join(dirs[r], "s.sock")
		d := startDaemon(t, exec.Command(bin, "serve", "--socket", sock, "--no-probes"))
		caps = append(caps, captureRank(t, sock, filepath.Join(dirs[r], fmt.Sprintf("cap.rank%05d-of-00002.strap", r)), r, hosts[r], forwards))
		if err := d.stop(t, os.Interrupt, 10*time.Second); err != nil {
			t.Fatalf("strapd %d: %v\n%s", r, err, d.stderr)
		}
	}
	good := manifestFor(t, caps, []string{"cap.rank00000-of-00002.strap", caps[1].path}, hosts, forwards)
	// Not the usual name: a manifest is told by its "format" key.
	mpath := filepath.Join(dirs[0], "job-set.data")
	writeManifest(t, mpath, good)

	code, out, stderr := runStrapd(t, bin, nil, "inspect", mpath)
	if code != 0 {
		t.Fatalf("inspect: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{"job tp-job  world size 2  layout tp 2 × pp 1 × dp 1", "node-b", "[0, 3)",
		"1 sharded, 1 replicated", caps[0].path, caps[1].path, "total 15 packets"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	code, out, stderr = runStrapd(t, bin, nil, "inspect", "--json", mpath)
	var sum setSummary
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil {
		t.Fatalf("inspect --json: exit %d\n%s%s", code, out, stderr)
	}
	if sum.CaptureSet.WorldSize != 2 || len(sum.Streams) != 2 || sum.Streams[0] != caps[0].path || sum.Streams[1] != caps[1].path ||
		sum.CaptureSet.Ranks[1].Session != caps[1].session || sum.CaptureSet.Ranks[1].Host != "node-b" {
		t.Fatalf("inspect --json: %+v", sum)
	}

	code, out, stderr = runStrapd(t, bin, nil, "verify", mpath)
	if code != 0 || !strings.Contains(out, ": OK (2 ranks)") {
		t.Fatalf("verify of the whole set: exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ = runStrapd(t, bin, nil, "verify", "--json", mpath)
	var rep captureset.SetReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || len(rep.Ranks) != 2 || !rep.Ranks[1].Verify.OK {
		t.Fatalf("verify --json: exit %d\n%s", code, out)
	}

	for _, tc := range []struct {
		name   string
		damage func(m map[string]any)
		want   []string
	}{
		{"wrong session", func(m map[string]any) { rank(m, 1)["session"] = caps[1].session + 7 },
			[]string{fmt.Sprintf("rank 1: session: manifest %d, stream header %d", caps[1].session+7, caps[1].session)}},
		{"missing rank", func(m map[string]any) { m["ranks"] = m["ranks"].([]any)[:1] },
			[]string{"rank 1: ranks: no entry for this rank"}},
		{"place taken twice", func(m map[string]any) { rank(m, 1)["tp_rank"] = 0 },
			[]string{"rank 1: tp_rank/pp_stage/dp_rank: place (tp_rank 0, pp_stage 0, dp_rank 0) is rank 0's too"}},
		{"stream missing", func(m map[string]any) { rank(m, 0)["stream"] = "cap.rank00000-of-00002.strap.gone" },
			[]string{"rank 0: stream: open stream: open " + caps[0].path + ".gone: no such file or directory"}},
		{"packet count", func(m map[string]any) { rank(m, 1)["packets"] = caps[1].packets - 1 },
			[]string{fmt.Sprintf("rank 1: packets: manifest %d, stream %d", caps[1].packets-1, caps[1].packets)}},
		{"rank's stream is another rank's", func(m map[string]any) { rank(m, 0)["stream"] = caps[1].path },
			[]string{"rank 0: rank: manifest 0, stream header 1", "rank 0: modules.model.h.0: listed, but the stream has no record of it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := copyManifest(t, good)
			tc.damage(m)
			path := filepath.Join(dirs[0], "damaged.json")
			writeManifest(t, path, m)
			code, out, stderr := runStrapd(t, bin, nil, "verify", path)
			if code != 2 {
				t.Fatalf("verify: exit %d, want 2\n%s%s", code, out, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(out+stderr, w) {
					t.Errorf("verify does not say %q:\n%s%s", w, out, stderr)
				}
			}
		})
	}

	t.Run("neither a stream nor a manifest", func(t *testing.T) {
		path := filepath.Join(dirs[0], "other.json")
		if err := os.WriteFile(path, []byte(`{"format":"something-else"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []string{"inspect", "verify"} {
			code, out, stderr := runStrapd(t, bin, nil, cmd, path)
			if code == 0 || !strings.Contains(out+stderr, "magic") {
				t.Errorf("%s of a JSON file that is no manifest: exit %d\n%s%s", cmd, code, out, stderr)
			}
		}
	})

	// The same set in object storage: the manifest and both streams under one prefix of a
	// real S3 server, the streams named relative to the manifest; and a local manifest
	// naming one rank's stream by its s3:// URL.
	t.Run("s3", func(t *testing.T) {
		srv := uploadtest.Start(t)
		c := srv.Client(t)
		srv.Bucket(t, c, "caps")
		put := func(key string, body []byte) {
			t.Helper()
			if _, err := c.S3().PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("caps"), Key: aws.String(key),
				Body: bytes.NewReader(body)}); err != nil {
				t.Fatal(err)
			}
		}
		for _, rc := range caps {
			b, err := os.ReadFile(rc.path)
			if err != nil {
				t.Fatal(err)
			}
			put("job1/"+filepath.Base(rc.path), b)
		}
		inS3 := copyManifest(t, good)
		rank(inS3, 1)["stream"] = filepath.Base(caps[1].path)
		b, _ := json.Marshal(inS3)
		put("job1/cap.capture-set.json", b)
		env := srv.Env()
		code, out, stderr := runStrapd(t, bin, env, "verify", "--s3-endpoint", srv.Endpoint, "s3://caps/job1/cap.capture-set.json")
		if code != 0 || !strings.Contains(out, "rank 1: OK  s3://caps/job1/cap.rank00001-of-00002.strap") {
			t.Fatalf("verify of a manifest in S3: exit %d\n%s%s", code, out, stderr)
		}
		code, out, stderr = runStrapd(t, bin, env, "inspect", "--s3-endpoint", srv.Endpoint, "s3://caps/job1/cap.capture-set.json")
		if code != 0 || !strings.Contains(out, "s3://caps/job1/cap.rank00000-of-00002.strap") {
			t.Fatalf("inspect of a manifest in S3: exit %d\n%s%s", code, out, stderr)
		}
		local := copyManifest(t, good)
		rank(local, 1)["stream"] = "s3://caps/job1/cap.rank00001-of-00002.strap"
		path := filepath.Join(dirs[0], "mixed.capture-set.json")
		writeManifest(t, path, local)
		if code, out, stderr := runStrapd(t, bin, env, "verify", "--s3-endpoint", srv.Endpoint, path); code != 0 {
			t.Fatalf("verify of a local manifest with an s3:// rank: exit %d\n%s%s", code, out, stderr)
		}
		// The object differs from what the manifest says of it.
		rank(local, 1)["bytes"] = 1
		writeManifest(t, path, local)
		if code, out, stderr := runStrapd(t, bin, env, "verify", "--s3-endpoint", srv.Endpoint, path); code != 2 ||
			!strings.Contains(out, "rank 1: bytes: manifest 1, stream ") {
			t.Fatalf("verify of a wrong s3:// rank: exit %d\n%s%s", code, out, stderr)
		}
	})
}

func rank(m map[string]any, i int) map[string]any { return m["ranks"].([]any)[i].(map[string]any) }
