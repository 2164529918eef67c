//go:build linux && amd64 && privileged

package bpf

import (
	"fmt"
	"io"
	"math/bits"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/trace"
)

// Each test below makes a child process cause the events of one collector, watches it,
// and checks that the probes saw them; an identical unwatched child, where there is one,
// shows that the in-kernel filter holds. The Python children are kept free of single
// quotes: they run as sh -c '...'.

// sawLatency reports whether l has a timed event of at least min µs that landed no more
// than three slots above min's (at most about 8× longer: a loaded test machine may delay
// a wakeup, never by that much), and total time of at least min.
func sawLatency(l trace.LatencyStats, minUs uint64) bool {
	lo := bits.Len64(minUs)
	for _, b := range l.Buckets {
		if b.Slot >= lo && b.Slot <= lo+3 && b.Count > 0 {
			return l.TotalNs >= minUs*1000
		}
	}
	return false
}

const syncWaits = `import ctypes, select, time
libc = ctypes.CDLL(None, use_errno=True)
class TS(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
word = ctypes.c_int(0)
# FUTEX_WAIT_PRIVATE on a word that holds the expected 0: sleeps until the 50 ms timeout.
r = libc.syscall(202, ctypes.byref(word), 128, 0, ctypes.byref(TS(0, 50000000)))
assert r == -1 and ctypes.get_errno() == 110, (r, ctypes.get_errno())
select.poll().poll(30)
assert libc.ppoll(None, 0, ctypes.byref(TS(0, 25000000)), None) == 0
select.epoll().poll(0.015)
time.sleep(0.02)
`

// TestSyncWaits: a futex wait that times out after 50 ms, a 30 ms poll, a 25 ms ppoll, a
// 15 ms epoll_wait and a 20 ms sleep each land in their kind's histogram at their length,
// and in the per-syscall statistics with the futex's ETIMEDOUT counted as an error.
func TestSyncWaits(t *testing.T) {
	py := python(t)
	c := startAttached(t, Options{})
	watched := startGated(t, fmt.Sprintf("%s -c '%s'", py, syncWaits))
	other := startGated(t, fmt.Sprintf("%s -c '%s'", py, syncWaits))
	s := measure(t, c, watched, other)
	key := strconv.Itoa(watched.pid)
	waits := s.SyncWait[key]
	t.Logf("sync waits %+v", waits)
	for _, w := range []struct {
		kind string
		us   uint64
	}{{"futex", 50000}, {"poll", 30000}, {"ppoll", 25000}, {"epoll_wait", 15000}, {"clock_nanosleep", 20000}} {
		if l := waits[w.kind]; !sawLatency(l, w.us) || l.Timed != l.Count {
			t.Errorf("%s: %+v, want a timed wait of %d µs", w.kind, l, w.us)
		}
	}
	if l := waits["futex"]; l.Errors < 1 {
		t.Errorf("futex: %d errors, want the ETIMEDOUT counted", l.Errors)
	}
	sc := s.SyscallLatency[key]
	for _, name := range []string{"futex", "poll", "ppoll", "clock_nanosleep"} {
		if l := sc[name]; l.Count < 1 || l.Timed != l.Count {
			t.Errorf("syscall %s: %+v, want counted and timed", name, l)
		}
	}
	if l := sc["futex"]; l.Errors < 1 || !sawLatency(l, 50000) {
		t.Errorf("syscall futex: %+v, want the 50 ms ETIMEDOUT", l)
	}
	if _, ok := s.SyncWait[strconv.Itoa(other.pid)]; ok {
		t.Errorf("unwatched child counted: %+v", s.SyncWait[strconv.Itoa(other.pid)])
	}
	if _, ok := s.SyscallLatency[strconv.Itoa(other.pid)]; ok {
		t.Error("unwatched child's syscalls counted")
	}
}

const syscallMix = `import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/zero", os.O_RDONLY)
for _ in range(int(sys.argv[1])):
    os.read(fd, 1)
for _ in range(int(sys.argv[2])):
    try:
        os.close(100000)
    except OSError:
        pass
buf = ctypes.create_string_buffer(1 << 16)
assert libc.mlock(buf, 1 << 16) == 0, ctypes.get_errno()
`

// TestSyscallLatencySampling: with read/write sampled one in 10, 3000 reads of /dev/zero
// are all counted and about a tenth timed; 500 failing closes are counted as errors and
// all timed; one mlock is counted and timed.
func TestSyscallLatencySampling(t *testing.T) {
	py := python(t)
	const reads, closes, every = 3000, 500, 10
	c := startAttached(t, Options{SampleReadWrite: every})
	g := startGated(t, fmt.Sprintf("%s -c '%s' %d %d", py, syscallMix, reads, closes))
	sc := measure(t, c, g).SyscallLatency[strconv.Itoa(g.pid)]
	rd, cl, ml := sc["read"], sc["close"], sc["mlock"]
	t.Logf("read %+v\nclose %+v\nmlock %+v (%d syscalls seen)", rd, cl, ml, len(sc))
	// The sampling counter is per CPU and shared by reads and writes, so the timed share
	// is a tenth give or take one per CPU the child ran on (and its few writes).
	slack := uint64(2*runtime.NumCPU() + 4)
	if rd.Count < reads || rd.Timed+slack < rd.Count/every || rd.Timed > rd.Count/every+slack {
		t.Errorf("read: %d calls, %d timed; want >= %d calls and about %d timed", rd.Count, rd.Timed, reads, rd.Count/every)
	}
	if cl.Errors < closes || cl.Timed != cl.Count {
		t.Errorf("close: %+v, want >= %d errors, every call timed", cl, closes)
	}
	if ml.Count != 1 || ml.Errors != 0 || ml.Timed != 1 || len(ml.Buckets) != 1 {
		t.Errorf("mlock: %+v, want one timed successful call", ml)
	}
}

const busyPair = `import os, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
pid = os.fork()
end = time.monotonic() + 0.6
while time.monotonic() < end:
    pass
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
`

// TestRunqueueLatency: the watched process and a forked sibling (a new, unwatched
// process) spin on the same CPU for 0.6 s, so the watched one spends a good part of that
// runnable but waiting for the CPU: its run-queue histogram must hold at least 100 ms.
func TestRunqueueLatency(t *testing.T) {
	py := python(t)
	c := startAttached(t, Options{})
	g := startGated(t, fmt.Sprintf("%s -c '%s'", py, busyPair))
	s := measure(t, c, g)
	l := s.RunqueueLatency[strconv.Itoa(g.pid)]
	t.Logf("run-queue latency %+v; off-CPU %+v", l, s.OffCPU[strconv.Itoa(g.pid)])
	if l.Count < 1 || l.Timed != l.Count || l.TotalNs < 100e6 {
		t.Fatalf("run-queue latency %+v: want >= 100 ms waited", l)
	}
	var n uint64
	for _, b := range l.Buckets {
		n += b.Count
	}
	if n != l.Timed {
		t.Errorf("buckets hold %d waits, timed %d", n, l.Timed)
	}
	if o := s.OffCPU[strconv.Itoa(g.pid)]; o.RunnableNs < l.TotalNs {
		t.Errorf("off-CPU runnable %d ns < run-queue total %d ns: they measure the same waits", o.RunnableNs, l.TotalNs)
	}
}

const tcpLoopback = `import socket, sys
n, m = int(sys.argv[1]), int(sys.argv[2])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
cli = socket.create_connection(srv.getsockname())
conn, _ = srv.accept()
cli.sendall(b"x" * n)
got = 0
while got < n:
    got += len(conn.recv(1 << 20))
conn.sendall(b"y" * m)
got = 0
while got < m:
    got += len(cli.recv(1 << 20))
`

// TestTCPLoopback: 3 MB one way and 1000 bytes back over loopback, both ends in the
// watched process: it sent and received exactly 3 001 000 bytes over TCP. An identical
// unwatched child is not counted.
func TestTCPLoopback(t *testing.T) {
	py := python(t)
	const n, m = 3_000_000, 1000
	c := startAttached(t, Options{})
	cmd := fmt.Sprintf("%s -c '%s' %d %d", py, tcpLoopback, n, m)
	watched, other := startGated(t, cmd), startGated(t, cmd)
	s := measure(t, c, watched, other)
	got := s.TCP[strconv.Itoa(watched.pid)]
	t.Logf("tcp %+v", got)
	if got.TxBytes != n+m || got.RxBytes != n+m || got.TxCalls < 2 || got.RxCalls < 2 {
		t.Errorf("tcp %+v: want %d bytes each way in >= 2 calls", got, n+m)
	}
	if o, ok := s.TCP[strconv.Itoa(other.pid)]; ok {
		t.Errorf("unwatched child counted: %+v", o)
	}
}

const nvidiaIoctls = `import errno, fcntl, os, sys
d = sys.argv[1]
fd = os.open(os.path.join(d, "nvidia0"), os.O_RDWR)
try:
    fcntl.ioctl(fd, 0x4600)
    raise SystemExit("ioctl on the null device succeeded")
except OSError as e:
    assert e.errno == errno.ENOTTY, e
try:
    os.close(os.open(os.path.join(d, "nvidia1"), os.O_RDWR))
    print("a driver answers major 195 here; only the O_PATH ioctl below is driver-free")
except OSError as e:
    assert e.errno in (errno.ENXIO, errno.ENODEV), e
p = os.open(os.path.join(d, "nvidia1"), os.O_PATH)
try:
    fcntl.ioctl(p, 0x4600)
    raise SystemExit("ioctl on an O_PATH descriptor succeeded")
except OSError as e:
    assert e.errno == errno.EBADF, e
n = os.open("/dev/null", os.O_RDWR)
try:
    fcntl.ioctl(n, 0x4600)
except OSError:
    pass
`

// TestNvidiaIoctl: ioctls on descriptors whose file is named like /dev/nvidia* are timed
// in their own histogram, and one on /dev/null is not. No nvidia driver is needed: the
// probe goes by the name. nvidia0 is a char node with /dev/null's numbers (1:3), so it
// opens and its ioctl fails with ENOTTY in the driver; nvidia1 is 195:0, nvidia's
// major, which without the driver fails to open (ENXIO), so it is opened O_PATH, whose
// ioctl fails with EBADF before any driver is asked. Both are counted, with their errors.
func TestNvidiaIoctl(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{"nvidia0", 1, 3}, {"nvidia1", 195, 0}} {
		path := filepath.Join(dir, n.name)
		if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			t.Skipf("skipping: mknod %s (needs CAP_MKNOD): %v", path, err)
		}
	}
	c := startAttached(t, Options{})
	g := startGated(t, fmt.Sprintf("%s -c '%s' %s", py, nvidiaIoctls, dir))
	s := measure(t, c, g)
	l := s.NvidiaIoctl[strconv.Itoa(g.pid)]
	all := s.SyscallLatency[strconv.Itoa(g.pid)]["ioctl"]
	t.Logf("nvidia ioctls %+v; all ioctls %+v", l, all)
	if l.Count != 2 || l.Errors != 2 || l.Timed != 2 || len(l.Buckets) == 0 {
		t.Errorf("nvidia ioctls %+v: want 2, both failed, both timed", l)
	}
	if all.Count < 3 {
		t.Errorf("ioctl syscalls %+v: want the /dev/null one counted too (>= 3)", all)
	}
}

const bigRSS = `import sys
b = b"\x01" * (int(sys.argv[1]) << 20)
sys.stdin.readline()
`

// TestRSS: a process holding 64 MiB it wrote shows an RSS and a peak of at least that.
func TestRSS(t *testing.T) {
	py := python(t)
	const mib = 64
	c := startAttached(t, Options{})
	g := startGated(t, fmt.Sprintf("%s -c '%s' %d", py, bigRSS, mib))
	if err := c.Watch(g.pid); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(g.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	var m trace.Memory
	for range 100 { // until the child has written its buffer
		m = c.Snapshot().Memory[strconv.Itoa(g.pid)]
		if m.RSSBytes >= mib<<20 {
			break
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 50e6}, nil)
	}
	t.Logf("memory %+v", m)
	if m.RSSBytes < mib<<20 || m.RSSPeakBytes < m.RSSBytes {
		t.Fatalf("memory %+v: want rss >= %d MiB and peak >= rss", m, mib)
	}
	g.releaseAndWait(t)
}
