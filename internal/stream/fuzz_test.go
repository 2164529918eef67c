package stream

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/strap-llm/strap/internal/jsontext"
)

// FuzzReader treats arbitrary bytes as a stream file: every walk must end in a clean stop
// or an error naming an offset, never a panic, a hang or an allocation beyond the input.
// Seeds: the golden streams in testdata/stream.
func FuzzReader(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join(goldenDir, "*.strap"))
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(FileMagic))
	// Right CRCs around text that is not Unicode: names, meta, INDEX names, header metadata.
	for _, tc := range invalidTextStreams(f) {
		f.Add(tc.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		size := int64(len(data))
		rep := Verify(bytes.NewReader(data), size)
		if rep.OK {
			// A stream verify passes hands out only valid text.
			r, err := NewReader(bytes.NewReader(data), size)
			if err != nil {
				t.Fatalf("verify OK, reader fails: %v", err)
			}
			for s := r.Scan(false); s.Next(); {
				if p := s.Packet(); !utf8.ValidString(p.Name) || jsontext.Check(p.Meta) != nil {
					t.Fatalf("verify OK with packet name %q meta %q at %d", p.Name, p.Meta, p.Offset)
				}
			}
		}
		r, err := NewReader(bytes.NewReader(data), size)
		if err != nil {
			var oe *OffsetError
			if !errors.As(err, &oe) {
				t.Fatalf("reader error without offset: %v", err)
			}
			if rep.OK {
				t.Fatal("verify OK on a file the reader rejects")
			}
			return
		}
		ts := r.Tensors()
		n := 0
		for ts.Next() {
			tn := ts.Tensor()
			if want, ok := tensorBytes(tn.Shape, tn.DType.Size()); !ok || want != uint64(len(tn.Data)) {
				t.Fatalf("tensor %q: %d bytes for shape %v", tn.Name, len(tn.Data), tn.Shape)
			}
			n++
		}
		if err := ts.Err(); err != nil {
			var oe *OffsetError
			if !errors.As(err, &oe) || oe.Offset < 0 || oe.Offset > size {
				t.Fatalf("tensor walk error without a valid offset: %v", err)
			}
			if rep.OK {
				t.Fatalf("verify OK but tensor walk failed: %v", err)
			}
		}
		if rep.OK && uint64(n) > rep.Tensors {
			t.Fatalf("%d tensors from %d TENSOR packets", n, rep.Tensors)
		}
		// The resume point: a packet boundary inside the file, every packet before it
		// verifying, and CheckPrefix accepting that prefix as what it says it holds.
		run := IntactRun(r, r.Header().DataOffset, 0)
		if run.End < r.Header().DataOffset || run.End > size || (run.Last == nil) != (run.Tokens == 0) {
			t.Fatalf("intact run %+v in a file of %d bytes", run, size)
		}
		if run.Last != nil {
			pr, err := NewReader(bytes.NewReader(data), run.End)
			if err != nil {
				t.Fatalf("prefix reader: %v", err)
			}
			if _, errs := CheckPrefix(pr, ResumeExpect{AppendAt: run.End, LastSeq: run.Last.Seq, LastCRC: run.Last.CRC,
				Packets: run.Packets}, nil); len(errs) > 0 {
				t.Fatalf("intact run %+v is not a resumable prefix: %v", run, errs)
			}
		}
		_, _, _ = r.Entries()
		if _, err := Inspect(bytes.NewReader(data), size); err != nil {
			t.Fatalf("inspect failed after NewReader succeeded: %v", err)
		}
	})
}
