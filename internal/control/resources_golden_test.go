package control

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestResourceLinesGolden sends each golden resource-event file (written by the Python
// builders, testdata/resource_events) as the client does, its events in RESOURCES bodies,
// and requires strapd's lines to be the file's bytes: every event accepted, none
// rewritten. Bodies are pretty-printed too, as nothing stops a client from sending them so.
func TestResourceLinesGolden(t *testing.T) {
	files, err := filepath.Glob("../../testdata/resource_events/*.jsonl")
	if err != nil || len(files) < 5 {
		t.Fatalf("golden resource-event files: %v, %v", files, err)
	}
	for _, p := range files {
		t.Run(filepath.Base(p), func(t *testing.T) {
			want, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			lines := bytes.Split(bytes.TrimSuffix(want, []byte("\n")), []byte("\n"))
			for _, sep := range []string{",", ",\n  "} {
				var got []byte
				for start := 0; start < len(lines); start += 50 { // bodies of 50 events
					batch := lines[start:min(start+50, len(lines))]
					body := `{"events": [` + string(bytes.Join(batch, []byte(sep))) + "]}"
					out, n, err := ResourceLines(resourcesMsg(body))
					if err != nil || n != len(batch) {
						t.Fatalf("events %d..: %d lines, %v", start, n, err)
					}
					got = append(got, out...)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("separator %q: lines differ from the golden file", sep)
				}
			}
		})
	}
}
