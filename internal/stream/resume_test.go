package stream

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// resumePackets is a fixed sequence of TENSOR and TOKEN packets (step k: two tensors, then
// token k), the shape of a per-token capture.
func resumePackets(n int) []Packet {
	var ps []Packet
	seq := uint64(0)
	for k := 0; len(ps) < n; k++ {
		for _, name := range []string{"model.layers.0.mlp", "lm_head"} {
			seq++
			raw := randomBytes(64+8*k, seq)
			ps = append(ps, Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(len(raw))}, Seq: seq, Step: uint64(k), Forward: uint64(k), RawLen: uint64(len(raw))}, Name: name, Blocks: []Block{{Data: raw}}})
		}
		seq++
		ps = append(ps, Packet{Header: Header{Type: TypeToken, Seq: seq, Step: uint64(k)}, Name: "token", Meta: []byte(fmt.Sprintf(`{"token_id":%d,"text":"t%d","position":%d}`, k*7, k, k))})
	}
	return ps[:n]
}

func writeAll(t *testing.T, w *Writer, ps []Packet) {
	t.Helper()
	for i := range ps {
		if err := w.WritePacket(&ps[i]); err != nil {
			t.Fatal(err)
		}
	}
}

func readAll(t *testing.T, f *os.File) []byte {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestResumeEqualsUninterrupted: a stream checkpointed after k packets, then damaged in
// every way a crash leaves it, resumed at the checkpoint and finished, is byte-for-byte the
// stream written without a stop.
func TestResumeEqualsUninterrupted(t *testing.T) {
	const total, at = 30, 14
	ps := resumePackets(total)
	meta := map[string]any{"model_class": "T"}
	ref := tempFile(t)
	w, err := New(ref, meta)
	if err != nil {
		t.Fatal(err)
	}
	writeAll(t, w, ps)
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, ref)

	for _, tc := range []struct {
		name  string
		after func(t *testing.T, w *Writer, f *os.File) // what happens after the checkpoint
	}{
		{"nothing after", func(t *testing.T, w *Writer, f *os.File) { _ = w.Sync() }},
		{"client death (END, INDEX, footer)", func(t *testing.T, w *Writer, f *os.File) {
			writeAll(t, w, ps[at:at+5])
			if err := w.Abort(nil); err != nil {
				t.Fatal(err)
			}
		}},
		{"daemon death mid-packet", func(t *testing.T, w *Writer, f *os.File) {
			writeAll(t, w, ps[at:at+4])
			_ = w.Sync()
			if err := f.Truncate(w.Offset() - 10); err != nil {
				t.Fatal(err)
			}
		}},
		{"garbage tail", func(t *testing.T, w *Writer, f *os.File) {
			_ = w.Sync()
			if _, err := f.Write(bytes.Repeat([]byte{0xAB}, 333)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tempFile(t)
			w, err := New(f, meta)
			if err != nil {
				t.Fatal(err)
			}
			writeAll(t, w, ps[:at])
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			off, packets := w.Offset(), w.Packets()
			lastOff, lastCRC := w.LastPacket()
			if lastOff <= 0 || packets != at {
				t.Fatalf("checkpoint facts: last packet at %d, %d packets", lastOff, packets)
			}
			tc.after(t, w, f)
			// The writer that crashed is gone; the file is reopened read-write.
			g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			w2, err := Resume(g, ResumeExpect{AppendAt: off, LastSeq: ps[at-1].Seq, LastCRC: lastCRC, Packets: packets})
			if err != nil {
				t.Fatal(err)
			}
			if w2.Offset() != off || w2.Packets() != at || w2.Tokens() != at/3 {
				t.Fatalf("resumed writer: offset %d packets %d tokens %d", w2.Offset(), w2.Packets(), w2.Tokens())
			}
			writeAll(t, w2, ps[at:])
			if err := w2.Close(EndInfo{Status: "complete"}); err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, g); !bytes.Equal(got, want) {
				t.Fatalf("resumed stream (%d bytes) differs from the uninterrupted one (%d bytes)", len(got), len(want))
			}
			if rep := Verify(g, int64(len(want))); !rep.OK {
				t.Fatalf("verify: %+v", rep)
			}
		})
	}
}

func TestResumeMismatch(t *testing.T) {
	ps := resumePackets(9)
	f := tempFile(t)
	w, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	writeAll(t, w, ps[:6])
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	off := w.Offset()
	_, crc := w.LastPacket()
	good := ResumeExpect{AppendAt: off, LastSeq: 6, LastCRC: crc, Packets: 6}
	writeAll(t, w, ps[6:])
	// A client that died: its session ended "aborted" (a complete stream is never cut:
	// TestResumeCompleteRefused).
	if err := w.Abort(nil); err != nil {
		t.Fatal(err)
	}
	size := int64(len(readAll(t, f)))
	for _, tc := range []struct {
		name string
		mod  func(e *ResumeExpect)
	}{
		{"crc", func(e *ResumeExpect) { e.LastCRC ^= 1 }},
		{"seq", func(e *ResumeExpect) { e.LastSeq = 5 }},
		{"packets", func(e *ResumeExpect) { e.Packets = 7 }},
		{"mid-packet", func(e *ResumeExpect) { e.AppendAt = off - 3 }},
		{"past the end", func(e *ResumeExpect) { e.AppendAt = size + 1 }},
		{"zero", func(e *ResumeExpect) { e.AppendAt = 0 }},
		{"END inside the prefix", func(e *ResumeExpect) { e.AppendAt = size - FooterLen }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := good
			tc.mod(&e)
			g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if _, err := Resume(g, e); !errors.Is(err, ErrResumeMismatch) {
				t.Fatalf("Resume(%+v) = %v, want ErrResumeMismatch", e, err)
			}
			if st, _ := g.Stat(); st.Size() != size {
				t.Fatalf("a refused resume changed the file: %d bytes, was %d", st.Size(), size)
			}
		})
	}
	t.Run("write-only descriptor", func(t *testing.T) {
		g, err := os.OpenFile(f.Name(), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if _, err := Resume(g, good); err == nil {
			t.Fatal("resume through a write-only descriptor succeeded")
		}
	})
	t.Run("good", func(t *testing.T) {
		g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if _, err := Resume(g, good); err != nil {
			t.Fatal(err)
		}
	})
}

// BenchmarkCheckpoint is one step of a per-token capture (two tensors and a token) followed
// by what the daemon does for a checkpoint (flush, fdatasync, last packet facts), after a
// prefix of 10 or 10,000 tokens: the cost must not depend on the prefix.
func BenchmarkCheckpoint(b *testing.B) {
	for _, prefix := range []int{10, 10000} {
		b.Run(fmt.Sprintf("after_%d_tokens", prefix), func(b *testing.B) {
			f := tempFile(b)
			w, err := New(f, nil)
			if err != nil {
				b.Fatal(err)
			}
			raw := randomBytes(4096, 1)
			seq := uint64(0)
			step := func(k int) {
				for _, name := range []string{"model.layers.0.mlp", "lm_head"} {
					seq++
					p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{4096}, Seq: seq, Step: uint64(k), RawLen: 4096}, Name: name, Blocks: []Block{{Data: raw}}}
					if err := w.WritePacket(&p); err != nil {
						b.Fatal(err)
					}
				}
				seq++
				if err := w.WritePacket(&Packet{Header: Header{Type: TypeToken, Seq: seq, Step: uint64(k)}, Name: "token"}); err != nil {
					b.Fatal(err)
				}
			}
			for k := range prefix {
				step(k)
			}
			if err := w.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(2 * 4096)
			b.ResetTimer()
			for i := range b.N {
				step(prefix + i)
				if err := w.Sync(); err != nil {
					b.Fatal(err)
				}
				if off, crc := w.LastPacket(); off <= 0 || crc == 0 {
					b.Fatalf("last packet %d %#x", off, crc)
				}
			}
		})
	}
}

// TestResumeCompleteRefused: a resume whose append_at lies before the END of a finished
// capture (status "complete") is refused and leaves every byte; the same stream ended
// "aborted" or "error" is cut and resumed.
func TestResumeCompleteRefused(t *testing.T) {
	ps := resumePackets(9)
	for _, tc := range []struct {
		status  string
		refused bool
	}{
		{"complete", true},
		{"aborted", false},
		{"error", false},
	} {
		t.Run(tc.status, func(t *testing.T) {
			f := tempFile(t)
			w, err := New(f, nil)
			if err != nil {
				t.Fatal(err)
			}
			writeAll(t, w, ps[:6])
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			off := w.Offset()
			_, crc := w.LastPacket()
			writeAll(t, w, ps[6:])
			end := EndInfo{Status: tc.status}
			if tc.status == "error" {
				end.Error = "boom"
			}
			if err := w.Close(end); err != nil {
				t.Fatal(err)
			}
			want := readAll(t, f)
			g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			_, err = Resume(g, ResumeExpect{AppendAt: off, LastSeq: 6, LastCRC: crc, Packets: 6})
			got := readAll(t, g)
			if !tc.refused {
				if err != nil || int64(len(got)) != off {
					t.Fatalf("resume of an %s stream: err %v, %d bytes left (want %d)", tc.status, err, len(got), off)
				}
				return
			}
			if !errors.Is(err, ErrComplete) {
				t.Fatalf("resume of a complete stream: %v, want ErrComplete", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("a refused resume changed the stream: %d bytes, was %d", len(got), len(want))
			}
			for _, s := range []string{"END (complete)", fmt.Sprintf("cut %d bytes", int64(len(want))-off)} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}
