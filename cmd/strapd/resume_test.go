package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/checkpoint"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
)

func TestResumeConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  resumeConfig
		args []string
		want string
	}{
		{"stream", resumeConfig{}, []string{"s"}, ""},
		{"repair", resumeConfig{Repair: true}, []string{"s"}, ""},
		{"list", resumeConfig{List: "d"}, nil, ""},
		{"nothing", resumeConfig{}, nil, "name one STREAM"},
		{"both", resumeConfig{List: "d"}, []string{"s"}, "not both"},
		{"list repair", resumeConfig{List: "d", Repair: true}, nil, "--list takes"},
		{"repair force", resumeConfig{Repair: true, Force: true}, []string{"s"}, ""},
		{"force alone", resumeConfig{Force: true}, []string{"s"}, "--force goes with --repair"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate(tc.args)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

// runResume runs `strapd resume args...` in-process and returns stdout, its exit code and
// the error.
func runResume(t *testing.T, args ...string) (string, int, error) {
	t.Helper()
	cmd := newResumeCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	code := 0
	if err != nil {
		code = 1
		if ec, ok := errors.AsType[exitCoder](err); ok {
			code = ec.ExitCode()
		}
	}
	return out.String(), code, err
}

// killedCapture writes a stream checkpointed after 2 of 4 tokens whose session then ended
// as aborted, and its checkpoint file.
func killedCapture(t *testing.T, dir string) (string, *checkpoint.Checkpoint) {
	path := filepath.Join(dir, "run.strap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := stream.New(f, map[string]any{"client_metadata": map[string]any{"fingerprint": "fp"}})
	if err != nil {
		t.Fatal(err)
	}
	var ck *checkpoint.Checkpoint
	for k := range 4 {
		raw := bytes.Repeat([]byte{byte(k)}, 64)
		for _, p := range []stream.Packet{
			{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{64}, Seq: uint64(2*k + 1), Step: uint64(k), RawLen: 64}, Name: "m", Blocks: []stream.Block{{Data: raw}}},
			{Header: stream.Header{Type: stream.TypeToken, Seq: uint64(2*k + 2), Step: uint64(k)}, Name: "token", Meta: []byte(fmt.Sprintf(`{"token_id":%d}`, k))},
		} {
			if err := w.WritePacket(&p); err != nil {
				t.Fatal(err)
			}
		}
		if k == 1 {
			lo, lc := w.LastPacket()
			ck = &checkpoint.Checkpoint{Format: checkpoint.FormatName, Version: 1, Stream: path, Fingerprint: "fp",
				StreamOffset: w.Offset(), Packets: 4, LastSeq: 4, LastPacketOffset: lo, LastPacketCRC: lc, TokenCount: 2}
			b, _ := json.Marshal(ck)
			if err := os.WriteFile(checkpoint.DefaultPath(path), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Abort(nil); err != nil {
		t.Fatal(err)
	}
	return path, ck
}

func TestResumeCommand(t *testing.T) {
	dir := t.TempDir()
	path, ck := killedCapture(t, dir)
	size := fileLen(t, path)

	// Tokens 2 and 3 are intact past the checkpoint: the resume keeps them and cuts the
	// aborted session's END, INDEX and footer only.
	endAt := endOffset(t, path)
	out, code, err := runResume(t, path)
	if err != nil || !strings.Contains(out, "resume from token 4 at byte offset "+fmt.Sprint(endAt)) ||
		!strings.Contains(out, "2 tokens past the checkpoint (token 2, offset "+fmt.Sprint(ck.StreamOffset)+")") ||
		!strings.Contains(out, "would cut") || !strings.Contains(out, "END (aborted)") {
		t.Fatalf("resume: %v (%d)\n%s", err, code, out)
	}
	if fileLen(t, path) != size {
		t.Fatal("a check changed the stream")
	}
	out, _, err = runResume(t, "--list", dir, "--json")
	var es []checkpoint.Entry
	if err != nil || json.Unmarshal([]byte(out), &es) != nil || len(es) != 1 || !es[0].Resumable || es[0].CutTokens != 0 ||
		es[0].Source != checkpoint.SourceStream || es[0].ResumeToken != 4 {
		t.Fatalf("list: %v\n%s", err, out)
	}
	// Another checkpoint path that does not match: exit 2, nothing cut.
	bad := *ck
	bad.LastPacketCRC++
	b, _ := json.Marshal(bad)
	badPath := filepath.Join(dir, "other.json")
	_ = os.WriteFile(badPath, b, 0o644)
	out, code, _ = runResume(t, path, "--checkpoint", badPath, "--repair")
	if code != 2 || !strings.Contains(out, "NOT resumable") || !strings.Contains(out, "crc") || fileLen(t, path) != size {
		t.Fatalf("mismatch: exit %d\n%s", code, out)
	}
	out, _, err = runResume(t, path, "--repair")
	if err != nil || !strings.Contains(out, "cut ") || fileLen(t, path) != endAt {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	if _, code, err := runResume(t, filepath.Join(dir, "missing.strap")); err == nil || code != 1 {
		t.Fatalf("missing stream: %v exit %d", err, code)
	}
	// Without a checkpoint the stream alone says where to go on.
	if err := os.Remove(checkpoint.DefaultPath(path)); err != nil {
		t.Fatal(err)
	}
	out, _, err = runResume(t, path, "--json")
	var rep checkpoint.Report
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || !rep.Resumable || rep.Source != checkpoint.SourceStream ||
		rep.ResumeToken != 4 || rep.ResumeOffset != endAt || rep.Checkpoint != "" || rep.CutBytes != 0 {
		t.Fatalf("no checkpoint: %v\n%s", err, out)
	}
	out, code, _ = runResume(t, filepath.Join(dir, "other.json"))
	if code != 2 || !strings.Contains(out, "no checkpoint, and the stream header is not valid") {
		t.Fatalf("not a stream: exit %d\n%s", code, out)
	}
}

// endOffset is where the END packet of the stream at path starts.
func endOffset(t *testing.T, path string) int64 {
	t.Helper()
	r, f, err := stream.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := r.Scan(true)
	for sc.Next() {
		if sc.Packet().Type == stream.TypeEnd {
			return sc.Packet().Offset
		}
	}
	t.Fatalf("%s has no END: %v", path, sc.Err())
	return 0
}

// completeCapture writes a finished capture (END "complete", INDEX, footer) of 4 forward
// passes, with a TOKEN packet after each when tokens, without one otherwise (a capture
// without per-token tracking: issue 41 cut such a 313 MB stream to its header).
func completeCapture(t *testing.T, dir string, tokens bool) string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("done-%v.strap", tokens))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := stream.New(f, map[string]any{"client_metadata": map[string]any{"fingerprint": "fp"}})
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	for k := range 4 {
		seq++
		raw := bytes.Repeat([]byte{byte(k)}, 64)
		p := stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{64}, Seq: seq, Forward: uint64(k), RawLen: 64}, Name: "m", Blocks: []stream.Block{{Data: raw}}}
		if tokens {
			p.Step = uint64(k)
		}
		if err := w.WritePacket(&p); err != nil {
			t.Fatal(err)
		}
		if tokens {
			seq++
			tok := stream.Packet{Header: stream.Header{Type: stream.TypeToken, Seq: seq, Step: uint64(k)}, Name: "token", Meta: []byte(fmt.Sprintf(`{"token_id":%d}`, k))}
			if err := w.WritePacket(&tok); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(stream.EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestResumeCommandComplete: `strapd resume` on a finished capture plans no cut (it says the
// capture is complete, exit 2), --repair leaves every byte, and only --repair --force cuts,
// saying how many bytes it dropped.
func TestResumeCommandComplete(t *testing.T) {
	for _, tokens := range []bool{false, true} {
		t.Run(fmt.Sprintf("tokens=%v", tokens), func(t *testing.T) {
			dir := t.TempDir()
			path := completeCapture(t, dir, tokens)
			before, _ := os.ReadFile(path)
			resumeAt := endOffset(t, path)
			if !tokens {
				r, f, err := stream.OpenFile(path)
				if err != nil {
					t.Fatal(err)
				}
				resumeAt = r.Header().DataOffset
				f.Close()
			}
			cut := int64(len(before)) - resumeAt
			out, code, _ := runResume(t, path)
			if code != 2 || !strings.Contains(out, "complete capture, nothing to resume") ||
				!strings.Contains(out, fmt.Sprintf("a resume would cut %d bytes", cut)) || strings.Contains(out, "resumable (") {
				t.Fatalf("plan: exit %d\n%s", code, out)
			}
			out, _, _ = runResume(t, path, "--json")
			var rep checkpoint.Report
			if json.Unmarshal([]byte(out), &rep) != nil || rep.Resumable || !rep.Complete || rep.CutBytes != cut {
				t.Fatalf("plan --json:\n%s", out)
			}
			out, code, _ = runResume(t, path, "--repair")
			if after, _ := os.ReadFile(path); code != 2 || !bytes.Equal(after, before) || !strings.Contains(out, "left as it is") {
				t.Fatalf("--repair of a complete capture: exit %d, %d bytes (were %d)\n%s", code, len(after), len(before), out)
			}
			out, code, err := runResume(t, path, "--repair", "--force")
			if err != nil || code != 0 || fileLen(t, path) != resumeAt || !strings.Contains(out, fmt.Sprintf("cut %d bytes", cut)) ||
				!strings.Contains(out, "END (complete)") {
				t.Fatalf("--repair --force: %v exit %d, %d bytes\n%s", err, code, fileLen(t, path), out)
			}
		})
	}
}
