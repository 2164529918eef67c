package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		if c.StreamOffset <= 0 || c.LastSeq < c.Packets {
			t.Fatalf("accepted inconsistent checkpoint %+v", c)
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
	for _, tc := range []struct {
		name      string
		end       func(w *stream.Writer, f *os.File)
		cutTokens uint64
		torn      bool
		endStatus string
	}{
		{"client killed (aborted END)", abort, 3, false, "aborted"},
		{"daemon killed, torn tail", func(w *stream.Writer, f *os.File) {
			_ = w.Sync()
			_ = f.Truncate(w.Offset() - 7)
		}, 2, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, ck := capture(t, 7, 4, "sha256:abc", tc.end)
			rep, _, err := CheckFile(path, "")
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Resumable || rep.ResumeToken != 4 || rep.ResumeOffset != ck.StreamOffset || rep.CutTokens != tc.cutTokens ||
				(rep.TornAt >= 0) != tc.torn || rep.CutEnd != tc.endStatus {
				t.Fatalf("report %+v", rep)
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
			if _, err := Repair(path, ""); err != nil {
				t.Fatal(err)
			}
			st, _ := os.Stat(path)
			if st.Size() != ck.StreamOffset {
				t.Fatalf("repaired to %d bytes, checkpoint at %d", st.Size(), ck.StreamOffset)
			}
			rep, _, err = CheckFile(path, "")
			if err != nil || !rep.Resumable || rep.CutBytes != 0 {
				t.Fatalf("after repair: %+v %v", rep, err)
			}
		})
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
			if _, err := Repair(path, ""); !errors.Is(err, ErrMismatch) {
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
	if _, err := Repair(path, ""); !errors.Is(err, ErrInUse) {
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
	if es[0].Error == "" || es[1].Error != "" || !es[1].Resumable || es[1].ResumeToken != 2 {
		t.Fatalf("entries %+v", es)
	}
}
