package trace

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRepairFile: whatever the tail of a file, repair either refuses and leaves it alone
// or leaves a prefix that is empty or ends in a newline, after which a written line reads
// back.
func FuzzRepairFile(f *testing.F) {
	golden, err := os.ReadFile(filepath.Join(testdataDir, "snapshot.golden.jsonl"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden)
	f.Add(golden[:len(golden)-10])
	f.Add(append(append([]byte(nil), golden...), 0, 0, 0))
	f.Add([]byte("not a trace\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "t.jsonl")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		fh, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		cut, err := RepairFile(fh)
		after, rerr := os.ReadFile(path)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil {
			if !bytes.Equal(after, b) {
				t.Fatal("refused file was modified")
			}
			return
		}
		if int64(len(b))-cut != int64(len(after)) || !bytes.HasPrefix(b, after) {
			t.Fatalf("repair did not cut a suffix: cut %d, %d -> %d bytes", cut, len(b), len(after))
		}
		if len(after) > 0 && after[len(after)-1] != '\n' {
			t.Fatal("repaired file does not end in a newline")
		}
	})
}

func FuzzReadSnapshots(f *testing.F) {
	golden, err := os.ReadFile(filepath.Join(testdataDir, "snapshot.golden.jsonl"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden)
	f.Add(golden[:len(golden)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ReadSnapshots(bytes.NewReader(b))
	})
}
