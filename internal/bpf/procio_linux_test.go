//go:build linux

package bpf

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseProcIO(t *testing.T) {
	for _, tc := range []struct {
		name        string
		in          string
		read, write uint64
		bad         bool
	}{
		{name: "kernel's layout", in: "rchar: 9\nwchar: 8\nsyscr: 7\nsyscw: 6\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n",
			read: 4096, write: 8192},
		{name: "no trailing newline", in: "read_bytes: 1\nwrite_bytes: 2", read: 1, write: 2},
		{name: "missing write_bytes", in: "read_bytes: 1\n", bad: true},
		{name: "not a number", in: "read_bytes: -1\nwrite_bytes: 2\n", bad: true},
		{name: "empty", in: "", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := parseProcIO([]byte(tc.in))
			if tc.bad {
				if !errors.Is(err, ErrBadProcIO) {
					t.Fatalf("got %d %d %v, want ErrBadProcIO", r, w, err)
				}
				return
			}
			if err != nil || r != tc.read || w != tc.write {
				t.Fatalf("got %d %d %v, want %d %d", r, w, err, tc.read, tc.write)
			}
		})
	}
}

// TestProcIOKeptOpen: the descriptor is reused between readings and follows the process's
// own counters (this test's: it writes 1 MiB and fsyncs, so write_bytes grows).
func TestProcIOKeptOpen(t *testing.T) {
	if _, err := os.Stat("/proc/self/io"); err != nil {
		t.Skipf("skipping: no /proc/self/io (kernel without task I/O accounting): %v", err)
	}
	p := procIO{root: "/proc"}
	defer p.forget(-1)
	_, w0, err := p.read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	f := p.files[os.Getpid()]
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Skipf("skipping: %s is tmpfs, whose writes task I/O accounting does not count", dir)
	}
	path := dir + "/w"
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	_, w1, err := p.read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.files[os.Getpid()] != f {
		t.Fatal("descriptor reopened")
	}
	if w1 < w0+1<<20 {
		t.Errorf("write_bytes %d -> %d after writing 1 MiB, want +1 MiB", w0, w1)
	}
}
