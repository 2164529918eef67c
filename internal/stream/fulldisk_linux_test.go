package stream

import (
	"errors"
	"os"
	"os/exec"
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

// TestFullDiskDirect: the same with O_DIRECT, on a 16 MiB ext4 loop mount (tmpfs is
// written buffered): the failed write is found by a later call, sticks, and the file is
// cut back to the packet boundary before it, every packet up to there verifying.
func TestFullDiskDirect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a loop mount needs root")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	dir := directDir(t)
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img, "16M").CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("loop mount (no loop devices here?): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	f, err := os.OpenFile(filepath.Join(mnt, "full.strap"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := NewWith(f, nil, WriterOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	if on, why := w.Direct(); !on {
		t.Fatalf("O_DIRECT not taken on ext4: %s", why)
	}
	var werr error
	seq := uint64(0)
	for i := 0; i < 400 && werr == nil; i++ {
		size := 40<<10 + 4*i // small packets at every alignment
		if i%3 == 2 {
			size = 3 << 20 // most of a staging buffer
		}
		raw := normalF32(size/4, 0.25, uint64(i))
		seq++
		werr = w.WritePacket(&Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{uint64(size / 4)},
			Seq: seq, RawLen: uint64(size)}, Name: "x", Blocks: []Block{{Data: raw[:size/2]}, {Data: raw[size/2:]}}, Shared: true})
		if werr == nil && i%7 == 6 {
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
	t.Logf("%d tensors kept, %d bytes", rep.Tensors, st.Size())
}
