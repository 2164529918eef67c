package trace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOpenFileMode: a trace file strapd creates (`strapd trace --output`) is 0600 whatever
// the umask (0 here: nothing masks the mode asked for), and in a setgid directory it keeps
// the directory's group (issue 41: another user on the host must not read a capture's files).
func TestOpenFileMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	const gid = 4242
	group := os.Getuid() == 0
	if group {
		if err := os.Chown(dir, -1, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o770|os.ModeSetgid); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "run.trace.jsonl")
	w, _, err := OpenFile(path, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("trace file created %#o, want 0600", st.Mode().Perm())
	}
	if g := st.Sys().(*syscall.Stat_t).Gid; group && g != gid {
		t.Errorf("trace file's group %d, want the setgid directory's %d", g, gid)
	}
}
