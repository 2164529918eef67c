package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
)

func TestParse(t *testing.T) {
	valid, err := os.ReadFile("testdata/valid.ckpt.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(valid)
	if err != nil {
		t.Fatal(err)
	}
	if c.StreamOffset != 4096 || c.LastPacketCRC != 0x12345678 || c.TokenCount != 10 {
		t.Fatalf("parsed %+v", c)
	}
	edit := func(k string, v any) []byte {
		var m map[string]any
		_ = json.Unmarshal(valid, &m)
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"not json", []byte("{"), "not a JSON object"},
		{"array", []byte("[]"), "not a JSON object"},
		{"format", edit("format", "other"), "format"},
		{"version", edit("version", 2), "version 2"},
		{"missing offset", edit("stream_offset", nil), `"stream_offset"`},
		{"missing fingerprint", edit("fingerprint", nil), `"fingerprint"`},
		{"zero offset", edit("stream_offset", 0), "stream_offset 0"},
		{"negative crc", edit("last_packet_crc", -1), "fields"},
		{"last packet past offset", edit("last_packet_offset", 5000), "last_packet_offset"},
		{"seq without packets", edit("packets", 0), "0 packets"},
		{"tokens over packets", edit("token_count", 31), "token_count"},
		{"too big", append(valid, bytes.Repeat([]byte(" "), MaxSize)...), "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.in)
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want ErrFormat mentioning %q", err, tc.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	valid, err := os.ReadFile("testdata/valid.ckpt.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add([]byte(`{"format":"strap-checkpoint","version":1}`))
	// every golden file (testdata/checkpoint: each client's, 1.3.1's, the invalid ones)
	golden, _ := filepath.Glob("../../testdata/checkpoint/*.ckpt.json")
	for _, g := range golden {
		if b, err := os.ReadFile(g); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		if c.StreamOffset <= 0 || c.LastSeq < c.Packets || c.Drops > c.Packets || c.TokenCount > c.Packets {
			t.Fatalf("accepted inconsistent checkpoint %+v", c)
		}
		if l := c.TokenLog; l != nil && (l.Tokens != c.TokenCount || l.Bytes < 0 || uint64(l.Bytes) < l.Tokens) {
			t.Fatalf("accepted a token log that does not fit: %+v", l)
		}
	})
}

// capture writes a stream of k steps (two tensors and a token each), checkpointing after
// step ckAt; it returns the file and the checkpoint, and the stream goes on to the end.
func capture(t *testing.T, steps, ckAt int, fp string, end func(w *stream.Writer, f *os.File)) (string, *Checkpoint) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "run.strap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := stream.New(f, map[string]any{"client_metadata": map[string]any{"fingerprint": fp}})
	if err != nil {
		t.Fatal(err)
	}
	var ck *Checkpoint
	seq := uint64(0)
	for k := 0; k < steps; k++ {
		for _, name := range []string{"a", "b"} {
			seq++
			raw := bytes.Repeat([]byte{byte(seq)}, 100)
			if err := w.WritePacket(&stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{100}, Seq: seq, Step: uint64(k), RawLen: 100}, Name: name, Blocks: []stream.Block{{Data: raw}}}); err != nil {
				t.Fatal(err)
			}
		}
		seq++
		if err := w.WritePacket(&stream.Packet{Header: stream.Header{Type: stream.TypeToken, Seq: seq, Step: uint64(k)}, Name: "token", Meta: []byte(fmt.Sprintf(`{"token_id":%d}`, k))}); err != nil {
			t.Fatal(err)
		}
		if k+1 == ckAt {
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			lo, lc := w.LastPacket()
			ck = &Checkpoint{Format: FormatName, Version: Version, Stream: path, Fingerprint: fp,
				StreamOffset: w.Offset(), Packets: w.Packets(), LastSeq: seq, LastPacketOffset: lo, LastPacketCRC: lc,
				TokenCount: uint64(ckAt), ForwardCount: uint64(ckAt)}
			b, _ := json.Marshal(ck)
			if err := os.WriteFile(DefaultPath(path), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	end(w, f)
	return path, ck
}

func TestCheckAndRepair(t *testing.T) {
	abort := func(w *stream.Writer, f *os.File) { _ = w.Abort(nil) }
	torn := func(w *stream.Writer, f *os.File) {
		_ = w.Sync()
		_ = f.Truncate(w.Offset() - 7)
	}
	for _, tc := range []struct {
		name      string
		steps     int
		end       func(w *stream.Writer, f *os.File)
		token     uint64 // where the resume goes on
		source    string
		cutPkts   uint64
		torn      bool
		endStatus string
	}{
		// Tokens 4..6 are intact past the checkpoint at 4: kept, only the END goes.
		{"client killed (aborted END)", 7, abort, 7, SourceStream, 0, false, "aborted"},
		// Token 6 is torn: tokens 4 and 5 are kept, the packets of step 6 go.
		{"daemon killed, torn tail", 7, torn, 6, SourceStream, 2, true, ""},
		// The first token past the checkpoint is torn: the checkpoint is where it goes on.
		{"torn right after the checkpoint", 5, torn, 4, SourceCheckpoint, 2, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, ck := capture(t, tc.steps, 4, "sha256:abc", tc.end)
			rep, _, err := CheckFile(path, "")
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Resumable || rep.ResumeToken != tc.token || rep.Source != tc.source || rep.TokenCount != 4 ||
				rep.CheckpointOffset != ck.StreamOffset || rep.CutPackets != tc.cutPkts || rep.CutTokens != 0 ||
				(rep.TornAt >= 0) != tc.torn || rep.CutEnd != tc.endStatus || rep.Packets != 3*tc.token ||
				rep.LastSeq != 3*tc.token || rep.CutBytes != rep.Size-rep.ResumeOffset {
				t.Fatalf("report %+v", rep)
			}
			if tc.source == SourceCheckpoint && rep.ResumeOffset != ck.StreamOffset {
				t.Fatalf("resume offset %d, checkpoint at %d", rep.ResumeOffset, ck.StreamOffset)
			}
			// verify reports the damage before the repair...
			if tc.torn {
				f, _ := os.Open(path)
				st, _ := f.Stat()
				v := stream.Verify(f, st.Size())
				f.Close()
				if !v.Truncated || v.FirstBadOffset != rep.TornAt {
					t.Fatalf("verify: truncated %v at %d, check says torn at %d", v.Truncated, v.FirstBadOffset, rep.TornAt)
				}
			}
			if _, err := Repair(path, "", false); err != nil {
				t.Fatal(err)
			}
			st, _ := os.Stat(path)
			if st.Size() != rep.ResumeOffset {
				t.Fatalf("repaired to %d bytes, resume point at %d", st.Size(), rep.ResumeOffset)
			}
			again, _, err := CheckFile(path, "")
			if err != nil || !again.Resumable || again.CutBytes != 0 || again.ResumeToken != tc.token {
				t.Fatalf("after repair: %+v %v", again, err)
			}
		})
	}
}

func TestCheckWithoutCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps int
		cut   int64 // bytes cut off the end
		token uint64
	}{
		{"every token intact", 3, 0, 3},
		{"last token torn", 3, 7, 2},
		{"first token torn", 1, 7, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, _ := capture(t, tc.steps, 0, "fp", func(w *stream.Writer, f *os.File) {
				_ = w.Sync()
				_ = f.Truncate(w.Offset() - tc.cut)
			})
			rep, c, err := CheckFile(path, "")
			if err != nil || c != nil {
				t.Fatal(err, c)
			}
			if !rep.Resumable || rep.Checkpoint != "" || rep.Source != SourceStream || rep.ResumeToken != tc.token ||
				rep.Packets != 3*tc.token || rep.StreamFingerprint != "fp" {
				t.Fatalf("report %+v", rep)
			}
			if _, err := Repair(path, "", false); err != nil {
				t.Fatal(err)
			}
			if st, _ := os.Stat(path); st.Size() != rep.ResumeOffset {
				t.Fatalf("repaired to %d bytes, resume point at %d", st.Size(), rep.ResumeOffset)
			}
		})
	}
	// A named checkpoint must exist; a file that is no stream is not resumable.
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.strap")
	_ = os.WriteFile(junk, []byte("not a stream"), 0o644)
	if _, _, err := CheckFile(junk, filepath.Join(dir, "none.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("named missing checkpoint: %v", err)
	}
	rep, _, err := CheckFile(junk, "")
	if err != nil || rep.Resumable || len(rep.Problems) != 1 {
		t.Fatalf("junk: %+v %v", rep, err)
	}
}

func TestCheckMismatch(t *testing.T) {
	keep := func(w *stream.Writer, f *os.File) { _ = w.Sync() }
	for _, tc := range []struct {
		name string
		mod  func(c *Checkpoint, path string)
		want string
	}{
		{"fingerprint", func(c *Checkpoint, _ string) { c.Fingerprint = "sha256:other" }, "fingerprint"},
		{"crc", func(c *Checkpoint, _ string) { c.LastPacketCRC++ }, "crc"},
		{"offset mid-packet", func(c *Checkpoint, _ string) { c.StreamOffset -= 5 }, "not the end of a packet"},
		{"packets", func(c *Checkpoint, _ string) { c.Packets++; c.LastSeq++ }, "packets"},
		{"stream shorter", func(c *Checkpoint, path string) { _ = os.Truncate(path, c.StreamOffset-1) }, "shorter"},
		{"payload changed", func(c *Checkpoint, path string) {
			f, _ := os.OpenFile(path, os.O_RDWR, 0)
			_, _ = f.WriteAt([]byte{0xEE}, c.StreamOffset-1-int64(len(`{"token_id":3}`)))
			f.Close()
		}, "crc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, ck := capture(t, 6, 4, "sha256:abc", keep)
			tc.mod(ck, path)
			b, _ := json.Marshal(ck)
			_ = os.WriteFile(DefaultPath(path), b, 0o644)
			before, _ := os.ReadFile(path)
			rep, _, err := CheckFile(path, "")
			if err != nil {
				t.Fatal(err)
			}
			if rep.Resumable || len(rep.Problems) == 0 || !strings.Contains(strings.Join(rep.Problems, "; "), tc.want) {
				t.Fatalf("report %+v, want a problem about %q", rep, tc.want)
			}
			if _, err := Repair(path, "", false); !errors.Is(err, ErrMismatch) {
				t.Fatalf("Repair = %v, want ErrMismatch", err)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Fatal("a refused repair changed the stream")
			}
		})
	}
}

func TestRepairRefusesLiveCapture(t *testing.T) {
	path, _ := capture(t, 6, 4, "fp", func(w *stream.Writer, f *os.File) { _ = w.Abort(nil) })
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := Repair(path, "", false); !errors.Is(err, ErrInUse) {
		t.Fatalf("Repair of a locked stream = %v, want ErrInUse", err)
	}
}

func TestList(t *testing.T) {
	path, _ := capture(t, 5, 2, "fp", func(w *stream.Writer, f *os.File) { _ = w.Abort(nil) })
	dir := filepath.Dir(path)
	// A checkpoint whose stream is gone and a file that is no checkpoint.
	_ = os.WriteFile(filepath.Join(dir, "gone.strap"+Suffix), []byte(`{}`), 0o644)
	es, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("%d entries: %+v", len(es), es)
	}
	if es[0].Error == "" || es[1].Error != "" || !es[1].Resumable || es[1].ResumeToken != 5 || es[1].TokenCount != 2 {
		t.Fatalf("entries %+v", es)
	}
}

// TestCheckFreedPrefix: a checkpointed prefix whose start was freed after its upload (holes
// punched, --upload-free-local) is reported as such, not as damaged packets: the freed
// range, and the checks that remain (the last packet, the checkpoint's tokens list).
func TestCheckFreedPrefix(t *testing.T) {
	abort := func(w *stream.Writer, f *os.File) { _ = w.Abort(nil) }
	path, ck := capture(t, 200, 150, "sha256:abc", abort)
	to := ck.LastPacketOffset &^ 4095
	punchFile := func(off, n int64) {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skipf("no hole punching here: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	punchFile(4096, to-4096)
	writeCk := func(tokens int) {
		b, _ := json.Marshal(ck)
		if tokens >= 0 {
			var list []string
			for i := 0; i < tokens; i++ {
				list = append(list, fmt.Sprintf(`{"token_index":%d,"token_id":%d,"token_text":"","position":%d}`, i, i, i))
			}
			b = append(b[:len(b)-1], []byte(`,"tokens":[`+strings.Join(list, ",")+`]}`)...)
		}
		if err := os.WriteFile(DefaultPath(path), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(wantOK bool, wantProblem string) Report {
		t.Helper()
		rep, _, err := CheckFile(path, "")
		if err != nil {
			t.Fatal(err)
		}
		if rep.Resumable != wantOK || len(rep.Freed) != 2 || rep.Freed[0] != 4096 {
			t.Fatalf("report %+v", rep)
		}
		if wantProblem != "" && (len(rep.Problems) == 0 || !strings.Contains(strings.Join(rep.Problems, "; "), wantProblem)) {
			t.Fatalf("problems %q, want %q", rep.Problems, wantProblem)
		}
		return rep
	}
	writeCk(-1)
	check(false, "neither a token log nor 1.3.1's tokens list")
	writeCk(149)
	check(false, "lists 149 tokens")
	writeCk(150)
	rep := check(true, "")
	if rep.Freed[1] != to || !strings.Contains(rep.FreedNote, "freed after their upload") || rep.ResumeToken != 200 ||
		rep.Source != SourceStream || rep.CutEnd != "aborted" {
		t.Fatalf("report %+v", rep)
	}
	// The token log instead of the list (what a capture that uploads writes): the first
	// bytes it vouches for, with their CRC32C; lines past them (tokens after it) are not read.
	var lines []byte
	for i := 0; i < 150; i++ {
		lines = append(lines, fmt.Sprintf(`{"token_index": %d, "token_id": %d, "token_text": "", "position": %d}`+"\n", i, i, i)...)
	}
	logged := *ck
	logged.TokenLog = &TokenLog{Tokens: 150, Bytes: int64(len(lines)), CRC32C: crc32.Checksum(lines, crc32.MakeTable(crc32.Castagnoli))}
	b, _ := json.Marshal(&logged)
	if err := os.WriteFile(DefaultPath(path), b, 0o644); err != nil {
		t.Fatal(err)
	}
	check(false, "token log: open")
	if err := os.WriteFile(TokenLogPath(DefaultPath(path)), append(lines, `{"token_index": 150}`+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	check(true, "")
	lines[10] ^= 1
	if err := os.WriteFile(TokenLogPath(DefaultPath(path)), lines, 0o644); err != nil {
		t.Fatal(err)
	}
	check(false, "CRC32C")
	writeCk(150)
	// Freed into the checkpoint's last packet (whole blocks, as strapd frees): nothing left
	// to check it against.
	punchFile(to, 4096)
	check(false, "past the checkpoint's last packet")
	if err := os.Remove(DefaultPath(path)); err != nil {
		t.Fatal(err)
	}
	check(false, "no checkpoint")
}

// TestCompleteNotCut: a finished capture (END "complete", INDEX, footer, no checkpoint) is
// never cut by Repair, with per-token TOKEN packets or none. Only force cuts, and the report
// says how many bytes that drops. With its checkpoint beside it, the same stream is a
// capture stopped by an error in the capturing code: resumable, cut back to its last token.
func TestCompleteNotCut(t *testing.T) {
	complete := func(w *stream.Writer, f *os.File) { _ = w.Close(stream.EndInfo{Status: "complete"}) }
	for _, tc := range []struct {
		name      string
		steps     int
		ckAt      int
		keepCkpt  bool
		noTokens  bool
		wantToken uint64
	}{
		{"tokens, no checkpoint", 5, 0, false, false, 5},
		{"tokens, checkpoint kept (stopped by an error)", 5, 3, true, false, 5},
		{"no per-token tracking", 5, 0, false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, _ := capture(t, tc.steps, tc.ckAt, "fp", complete)
			if tc.noTokens {
				path = withoutTokens(t, path)
			}
			if !tc.keepCkpt {
				_ = os.Remove(DefaultPath(path))
			}
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			rep, _, err := CheckFile(path, "")
			if err != nil {
				t.Fatal(err)
			}
			if tc.keepCkpt {
				if !rep.Resumable || rep.Complete || rep.CutEnd != "complete" || rep.ResumeToken != tc.wantToken {
					t.Fatalf("report with the checkpoint kept %+v", rep)
				}
				return
			}
			wantCut := int64(len(before)) - rep.ResumeOffset
			if rep.Resumable || !rep.Complete || rep.CutEnd != "complete" || !rep.CutIndex || rep.ResumeToken != tc.wantToken ||
				rep.CutBytes != wantCut || wantCut <= 0 || len(rep.Problems) != 1 ||
				!strings.Contains(rep.Problems[0], fmt.Sprintf("would cut %d bytes", wantCut)) {
				t.Fatalf("report %+v", rep)
			}
			if _, err := Repair(path, "", false); !errors.Is(err, stream.ErrComplete) {
				t.Fatalf("Repair of a complete stream: %v, want stream.ErrComplete", err)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
				t.Fatalf("Repair without force changed the complete stream: %d bytes, was %d", len(after), len(before))
			}
			forced, err := Repair(path, "", true)
			if err != nil || forced.CutBytes != wantCut {
				t.Fatalf("forced Repair: %+v %v", forced, err)
			}
			if st, _ := os.Stat(path); st.Size() != rep.ResumeOffset {
				t.Fatalf("forced Repair left %d bytes, resume point at %d", st.Size(), rep.ResumeOffset)
			}
		})
	}
}

// withoutTokens rewrites the stream at path with its TENSOR packets only (a capture without
// per-token tracking), ended complete; it returns the new stream's path.
func withoutTokens(t *testing.T, path string) string {
	t.Helper()
	r, f, err := stream.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := filepath.Join(filepath.Dir(path), "notokens.strap")
	g, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	w, err := stream.New(g, map[string]any{"client_metadata": map[string]any{"fingerprint": "fp"}})
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	sc := r.ScanFrom(r.Header().DataOffset, false)
	for sc.Next() {
		p := sc.Packet()
		if p.Type != stream.TypeTensor {
			continue
		}
		seq++
		raw := bytes.Repeat([]byte{byte(seq)}, 100)
		if err := w.WritePacket(&stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{100}, Seq: seq, Forward: seq / 2, RawLen: 100}, Name: p.Name, Blocks: []stream.Block{{Data: raw}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(stream.EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	return out
}
