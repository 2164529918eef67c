package stream

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// TestFullDisk: ENOSPC while writing (a 1 MiB tmpfs; needs root to mount) is a sticky
// error that names the free space, and the file is cut back to a packet boundary: every
// packet written before the failure verifies and nothing torn follows it.
func TestFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mounting a size-limited tmpfs needs root (CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	f, err := os.Create(filepath.Join(dir, "full.strap"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	seq := uint64(0)
	for i := 0; i < 100 && werr == nil; i++ {
		size := 40 << 10 // buffered
		if i%3 == 2 {
			size = 300 << 10 // written with writev
		}
		raw := normalF32(size/4, 0.25, uint64(i))
		seq++
		werr = w.WritePacket(&Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{uint64(size / 4)},
			Seq: seq, RawLen: uint64(size)}, Name: "x", Blocks: []Block{{Data: raw}}})
		if werr == nil && i%4 == 3 {
			werr = w.Sync()
		}
	}
	if !errors.Is(werr, syscall.ENOSPC) || !strings.Contains(werr.Error(), "bytes free of") {
		t.Fatalf("error %v, want ENOSPC naming the free space", werr)
	}
	if err := w.Close(EndInfo{Status: "complete"}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Close after ENOSPC = %v, want the same error", err)
	}
	st, _ := f.Stat()
	rep := Verify(f, st.Size())
	if rep.Truncated || rep.ValidUntil != st.Size() || rep.Tensors == 0 || rep.HasEnd {
		t.Fatalf("after ENOSPC the file should end on a packet boundary: %+v", rep)
	}
}
