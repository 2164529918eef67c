//go:build linux && amd64 && privileged

package bpf

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/trace"
)

// TestBlockIODirectWrite writes a known number of O_DIRECT blocks to a file on a real
// block device and checks the device's histogram and in-flight gauge.
func TestBlockIODirectWrite(t *testing.T) {
	dir := blockDeviceDir(t)
	dev, name, err := DiskOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := startAttached(t, Options{})
	c.Snapshot()

	const writes, size = 32, 64 << 10
	f, err := os.OpenFile(filepath.Join(dir, "direct.bin"), os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatalf("open O_DIRECT: %v", err)
	}
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = byte(i)
	}
	for i := range writes {
		if _, err := f.WriteAt(buf, int64(i)*size); err != nil {
			t.Fatalf("direct write %d: %v", i, err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s := c.Snapshot()
	var hist *trace.DeviceHistogram
	for i := range s.LatencyHistogram {
		if s.LatencyHistogram[i].Device == devString(dev) {
			hist = &s.LatencyHistogram[i]
		}
	}
	if hist == nil {
		t.Fatalf("no histogram for %s (%s) in %+v", name, devString(dev), s.LatencyHistogram)
	}
	if hist.Total < writes || hist.DeviceName != name {
		t.Fatalf("%s: histogram total %d, want >= %d", hist.DeviceName, hist.Total, writes)
	}
	t.Logf("%s: %d completions, buckets %+v", name, hist.Total, hist.Buckets)
	var wr trace.DeviceIO
	for _, d := range s.BlockIO {
		if d.DeviceName == name {
			wr = d
		}
	}
	if wr.WriteIOs < writes || wr.WriteBytes < writes*size {
		t.Fatalf("%s: %d writes / %d bytes, want >= %d / %d", name, wr.WriteIOs, wr.WriteBytes, writes, writes*size)
	}
	// Nothing leaks: with our writes done, in-flight returns to 0 (other processes may
	// have I/O outstanding for a moment, so poll briefly).
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := int64(-1)
		for _, d := range c.Snapshot().Inflight {
			if d.DeviceName == name {
				n = d.Count
			}
		}
		if n <= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d requests still in flight", name, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// blockDeviceDir returns a temp dir on a block-device filesystem (not tmpfs).
func blockDeviceDir(t *testing.T) string {
	t.Helper()
	for _, base := range []string{os.Getenv("STRAP_BLOCK_TMP"), "/var/tmp", "/work", os.TempDir()} {
		if base == "" {
			continue
		}
		var fs unix.Statfs_t
		if unix.Statfs(base, &fs) != nil || fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.OVERLAYFS_SUPER_MAGIC {
			continue
		}
		dir, err := os.MkdirTemp(base, "strap-bpf-")
		if err != nil {
			continue
		}
		if _, _, err := DiskOf(dir); err != nil {
			os.RemoveAll(dir)
			continue
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	t.Skip("skipping: no block-device filesystem for an O_DIRECT write (set STRAP_BLOCK_TMP)")
	return ""
}

// TestOffCPUSleep: a watched child that sleeps 300 ms shows >= 300 ms blocked, within 10%.
func TestOffCPUSleep(t *testing.T) {
	c := startAttached(t, Options{PerThread: true})
	g := startGated(t, "sleep 0.3")
	s := measure(t, c, g)
	key := strconv.Itoa(g.pid)
	o, ok := s.OffCPU[key]
	if !ok {
		t.Fatalf("no off-CPU entry for %d: %+v", g.pid, s.OffCPU)
	}
	t.Logf("child %d off-CPU %+v", g.pid, o)
	const want = 300e6
	if o.BlockedNs < want || o.BlockedNs > want*1.1 {
		t.Fatalf("blocked %v (sleep %v, io %v), want 300ms..330ms", time.Duration(o.BlockedNs), time.Duration(o.SleepNs), time.Duration(o.IONs))
	}
	if o.SleepNs < want {
		t.Errorf("sleep part %v < 300ms: nanosleep must count as interruptible sleep", time.Duration(o.SleepNs))
	}
	if s.OffCPUNs[key] != o.BlockedNs+o.RunnableNs {
		t.Errorf("off_cpu_ns %d != blocked %d + runnable %d", s.OffCPUNs[key], o.BlockedNs, o.RunnableNs)
	}
	if sc := s.Sched[key]; sc.Voluntary < 1 || sc.Source != trace.SourceBPF {
		t.Errorf("sched %+v: want >= 1 voluntary switch from bpf", sc)
	}
	found := false
	for _, th := range s.Threads {
		found = found || th.PID == g.pid
	}
	if !found {
		t.Errorf("per-thread breakdown has no thread of %d", g.pid)
	}
	// The child has exited: it is reported once more, then forgotten.
	if got := c.Snapshot().Watched; len(got) != 0 {
		t.Errorf("exited child still watched: %v", got)
	}
}

// TestPageFaults: a watched child touching N fresh pages shows >= N user faults, and an
// identical unwatched child is not counted (the filter is in the kernel).
func TestPageFaults(t *testing.T) {
	py := python(t)
	c := startAttached(t, Options{})
	const pages = 3000
	watched := startGated(t, fmt.Sprintf("%s -c '%s' %d", py, touchPages, pages))
	other := startGated(t, fmt.Sprintf("%s -c '%s' %d", py, touchPages, pages))
	s := measure(t, c, watched, other)
	t.Logf("watched child %d: %d user faults, detail %+v", watched.pid, s.PageFaults[strconv.Itoa(watched.pid)], s.PageFaultsDetail[strconv.Itoa(watched.pid)])
	if got := s.PageFaults[strconv.Itoa(watched.pid)]; got < pages {
		t.Fatalf("watched child: %d user page faults, want >= %d", got, pages)
	}
	if d := s.PageFaultsDetail[strconv.Itoa(watched.pid)]; d.Source != trace.SourceBPF || d.Minor+d.Major < pages {
		t.Errorf("page fault detail %+v: want source bpf and the /proc split (kept at exit) >= %d", d, pages)
	}
	if got, ok := s.PageFaults[strconv.Itoa(other.pid)]; ok {
		t.Fatalf("unwatched child counted: %d faults", got)
	}
}

const loadLike = `import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
MAPLEN, LOCKLEN = int(sys.argv[2]), int(sys.argv[3])
addr = libc.mmap(None, MAPLEN, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
assert addr not in (None, ctypes.c_void_p(-1).value)
assert libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(LOCKLEN)) == 0, ctypes.get_errno()
assert libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(LOCKLEN)) == 0
assert libc.mlock2(ctypes.c_void_p(addr), ctypes.c_size_t(LOCKLEN), 0) == 0
fd = os.open(os.path.join(sys.argv[1], "nvidia0"), os.O_RDONLY)
os.close(fd)
try:
    os.open(os.path.join(sys.argv[1], "nvidia-missing"), os.O_RDONLY)
except FileNotFoundError:
    pass
os.close(os.open(os.path.join(sys.argv[1], "plain"), os.O_RDONLY | os.O_CREAT))
`

// TestModelLoadingSyscalls: mmap and mlock of known sizes and an open of a device node
// named like /dev/nvidia0 are counted, and the nvidia paths recorded.
func TestModelLoadingSyscalls(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	node := filepath.Join(dir, "nvidia0")
	if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("skipping: mknod %s (needs CAP_MKNOD): %v", node, err)
	}
	c := startAttached(t, Options{})
	const mapLen, lockLen = 7<<20 + 3*4096, 2 << 20
	g := startGated(t, fmt.Sprintf("%s -c '%s' %s %d %d", py, loadLike, dir, mapLen, lockLen))
	s := measure(t, c, g)
	sc := s.Syscalls[strconv.Itoa(g.pid)]
	t.Logf("syscalls %+v, device opens %+v", sc, s.DeviceOpens)
	if sc.MmapCount < 1 || sc.MmapBytes < mapLen {
		t.Errorf("mmap %d calls / %d bytes, want >= 1 / %d", sc.MmapCount, sc.MmapBytes, mapLen)
	}
	if sc.MlockCount != 2 || sc.MlockBytes != 2*lockLen {
		t.Errorf("mlock+mlock2 %d calls / %d bytes, want 2 / %d", sc.MlockCount, sc.MlockBytes, 2*lockLen)
	}
	if sc.MunlockCount != 1 || sc.MunlockBytes != lockLen {
		t.Errorf("munlock %d calls / %d bytes, want 1 / %d", sc.MunlockCount, sc.MunlockBytes, lockLen)
	}
	if sc.OpenatCount < 3 || sc.OpenatFailed < 1 || sc.NvidiaOpens != 2 {
		t.Errorf("openat %+v: want >= 3 opens, >= 1 failed, 2 nvidia", sc)
	}
	var ok, failed bool
	for _, o := range s.DeviceOpens {
		if o.PID != g.pid {
			continue
		}
		switch o.Path {
		case node:
			ok = o.Ret >= 0
		case filepath.Join(dir, "nvidia-missing"):
			failed = o.Ret == -int64(unix.ENOENT)
		default:
			t.Errorf("unexpected device open recorded: %+v", o)
		}
	}
	if !ok || !failed {
		t.Errorf("device opens %+v: want %s (fd) and nvidia-missing (-ENOENT)", s.DeviceOpens, node)
	}
}

// TestCgroupFilter: a child in a watched cgroup is counted without being watched by pid.
func TestCgroupFilter(t *testing.T) {
	py := python(t)
	root := cgroup2Root(t)
	cg, err := os.MkdirTemp(root, "strap-test-")
	if err != nil {
		t.Skipf("skipping: cannot create a cgroup under %s: %v", root, err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	c := startAttached(t, Options{Cgroups: []string{cg}})
	const pages = 1000
	g := startGated(t, fmt.Sprintf("%s -c '%s' %d", py, touchPages, pages))
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(g.pid)), 0o644); err != nil {
		t.Skipf("skipping: cannot move a process into %s: %v", cg, err)
	}
	c.Snapshot()
	g.releaseAndWait(t)
	s := c.Snapshot()
	if got := s.PageFaults[strconv.Itoa(g.pid)]; got < pages {
		t.Fatalf("child in watched cgroup: %d faults, want >= %d", got, pages)
	}
}

func cgroup2Root(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var fs unix.Statfs_t
		if unix.Statfs(p, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	t.Skip("skipping: no cgroup v2 hierarchy mounted")
	return ""
}
