package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
)

// TestCheckWritableFile: the one check behind the output, trace and resource-log
// descriptors refuses what strapd must not write into, with bad_output and the
// descriptor's name, and passes the flags on for the caller's own rules.
func TestCheckWritableFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(flag int) func(t *testing.T) *os.File {
		return func(t *testing.T) *os.File {
			f, err := os.OpenFile(path, flag, 0)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	pipe := func(t *testing.T) *os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		return w
	}
	for _, tc := range []struct {
		name  string
		file  func(t *testing.T) *os.File
		err   string // "" when accepted
		flags int    // with err "": bits that must be set in the returned flags
	}{
		{"write-only", open(os.O_WRONLY), "", unix.O_WRONLY},
		{"read-write append", open(os.O_RDWR | os.O_APPEND), "", unix.O_RDWR | unix.O_APPEND},
		{"read-only", open(os.O_RDONLY), "thing is not open for writing (do it right)", 0},
		{"pipe", pipe, "thing is file type 010000, expected a regular file", 0},
		{"directory", func(t *testing.T) *os.File {
			f, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}, "thing is file type 040000, expected a regular file", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.file(t)
			defer f.Close()
			fl, err := checkWritableFile(int(f.Fd()), "thing", "do it right")
			if tc.err == "" {
				if err != nil || fl&tc.flags != tc.flags {
					t.Fatalf("flags %#x, err %v; want flags with %#x and no error", fl, err, tc.flags)
				}
				return
			}
			var ce *control.Error
			if !errors.As(err, &ce) || ce.Code != control.CodeBadOutput || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v; want bad_output with %q", err, tc.err)
			}
		})
	}
}
