package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Entry is one checkpoint found by List.
type Entry struct {
	Report
	// Error is why the checkpoint or its stream could not be read ("" when checked).
	Error string `json:"error,omitempty"`
}

// List finds the checkpoints in dir (files ending in Suffix, not recursing) and checks each
// against its stream: the file the checkpoint's name points at (stream + Suffix), or the
// path recorded in it when that one does not exist.
func List(dir string) ([]Entry, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []Entry
	for _, de := range des {
		if de.IsDir() || !strings.HasSuffix(de.Name(), Suffix) {
			continue
		}
		ck := filepath.Join(dir, de.Name())
		stream := StreamFor(ck)
		if _, err := os.Stat(stream); err != nil {
			if c, lerr := Load(ck); lerr == nil && c.Stream != "" {
				stream = c.Stream
			}
		}
		rep, _, err := CheckFile(stream, ck)
		e := Entry{Report: rep}
		e.Stream, e.Checkpoint = stream, ck
		if err != nil {
			e.Error = err.Error()
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Checkpoint < out[j].Checkpoint })
	return out, nil
}
