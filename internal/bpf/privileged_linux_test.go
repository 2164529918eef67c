//go:build linux && amd64 && privileged

package bpf

import (
	"errors"
	"math/bits"
	"os"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// loadedProbes loads the object without attaching it: maps are private to the test and
// programs run only through prog.Run.
func loadedProbes(t testing.TB) *probes {
	t.Helper()
	requireBPF(t)
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatalf("remove memlock: %v", err)
	}
	p := &probes{}
	if err := p.load(); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("skipping: loading BPF programs is not permitted here (EPERM): %v", err)
		}
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { p.objs.Close() })
	return p
}

func monoNow(t testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

func run(t *testing.T, prog *ebpf.Program, args ...uint64) {
	t.Helper()
	if _, err := prog.Run(&ebpf.RunOptions{Context: args}); err != nil {
		t.Fatalf("run: %v", err)
	}
}

func mapLen[K comparable, V any](t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var k K
	var v V
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestProgBlockRequests drives the block programs with fake request pointers: the kernel
// reads of the (bogus) struct fail and yield zeros, so everything lands on device 0, and
// the pairing logic keyed by the request pointer is what is tested.
func TestProgBlockRequests(t *testing.T) {
	p := loadedProbes(t)
	issue, complete, requeue := p.objs.BlockRqIssue, p.objs.BlockRqComplete, p.objs.BlockRqRequeue
	inflight := func() int { return mapLen[uint64, strapRqStart](t, p.objs.RqStarts) }
	total := func() (n uint64) {
		var d strapDevStats
		if err := p.objs.DevStatsMap.Lookup(uint32(0), &d); err != nil {
			return 0
		}
		for _, v := range d.Slots {
			n += v
		}
		return n
	}

	t.Run("issue-complete pairs by request and leaves nothing in flight", func(t *testing.T) {
		for r := uint64(1); r <= 5; r++ {
			run(t, issue, 0xffff000000000000+r*512)
		}
		if got := inflight(); got != 5 {
			t.Fatalf("in flight after 5 issues = %d, want 5", got)
		}
		for r := uint64(1); r <= 5; r++ {
			run(t, complete, 0xffff000000000000+r*512, 0, 4096)
		}
		if got := inflight(); got != 0 {
			t.Fatalf("in flight after completions = %d, want 0", got)
		}
		if got := total(); got != 5 {
			t.Fatalf("histogram total = %d, want 5", got)
		}
	})
	t.Run("re-issue of one request counts once", func(t *testing.T) {
		before := total()
		run(t, issue, 0xffff0000000a0000)
		run(t, issue, 0xffff0000000a0000)
		if got := inflight(); got != 1 {
			t.Fatalf("in flight = %d, want 1", got)
		}
		run(t, complete, 0xffff0000000a0000, 0, 0)
		run(t, complete, 0xffff0000000a0000, 0, 0) // a later partial completion
		if got := total() - before; got != 1 {
			t.Fatalf("completions counted = %d, want 1", got)
		}
	})
	t.Run("requeue forgets the request", func(t *testing.T) {
		before := total()
		run(t, issue, 0xffff0000000b0000)
		run(t, requeue, 0xffff0000000b0000)
		run(t, complete, 0xffff0000000b0000, 0, 0)
		if got := inflight(); got != 0 {
			t.Fatalf("in flight = %d, want 0", got)
		}
		if got := total() - before; got != 0 {
			t.Fatalf("requeued request counted %d times", got)
		}
	})
	t.Run("latency lands in its log2 slot", func(t *testing.T) {
		// Each latency sits in the lower half of its slot, so a few µs of delay change
		// nothing; and the test measures how long it really took between stamping the
		// start and the completion, so a stall of the test machine widens the accepted
		// slots by exactly what it added instead of failing. A wrong slot computation
		// still fails: the accepted range never reaches a wrong neighbour below.
		for _, tc := range []struct {
			us   uint64
			slot int
		}{{2500, 12}, {70, 7}, {70000, 17}} {
			if got := bits.Len64(tc.us); got != tc.slot {
				t.Fatalf("test table: %d µs is in slot %d, not %d", tc.us, got, tc.slot)
			}
			var before strapDevStats
			_ = p.objs.DevStatsMap.Lookup(uint32(0), &before)
			key := uint64(0xffff0000000c0000)
			t0 := monoNow(t)
			if err := p.objs.RqStarts.Put(key, strapRqStart{Ts: t0 - tc.us*1000, Bytes: 8192, Op: 1}); err != nil {
				t.Fatal(err)
			}
			run(t, complete, key, 0, 0)
			stalled := (monoNow(t) - t0) / 1000
			var after strapDevStats
			if err := p.objs.DevStatsMap.Lookup(uint32(0), &after); err != nil {
				t.Fatal(err)
			}
			hi := bits.Len64(tc.us + stalled + 1)
			var got []int
			for s := range after.Slots {
				for range after.Slots[s] - before.Slots[s] {
					got = append(got, s)
				}
			}
			if len(got) != 1 || got[0] < tc.slot || got[0] > hi {
				t.Errorf("%d µs (+%d µs of test delay): slots incremented %v, want one in %d..%d", tc.us, stalled, got, tc.slot, hi)
			}
			if after.Ios[1]-before.Ios[1] != 1 || after.Bytes[1]-before.Bytes[1] != 8192 {
				t.Errorf("%d µs: write ios/bytes += %d/%d, want 1/8192", tc.us, after.Ios[1]-before.Ios[1], after.Bytes[1]-before.Bytes[1])
			}
		}
	})
}

// TestProgOffCPUSplit seeds a switch-out stamp for tid 0 (what the bogus task pointers
// read as) and checks that wakeup closes the blocked part and switch-in the runnable part.
func TestProgOffCPUSplit(t *testing.T) {
	p := loadedProbes(t)
	for _, tc := range []struct {
		name   string
		reason uint32
		check  func(s strapThreadStats) uint64
	}{
		{"sleep", 1, func(s strapThreadStats) uint64 { return s.SleepNs }},
		{"io", 2, func(s strapThreadStats) uint64 { return s.IoNs }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = p.objs.ThreadStatsMap.Delete(uint32(0))
			const blocked = 200e6
			if err := p.objs.OffcpuStarts.Put(uint32(0), strapOffcpuStart{Ts: monoNow(t) - blocked, Reason: tc.reason, Tgid: 42}); err != nil {
				t.Fatal(err)
			}
			run(t, p.objs.SchedWakeup, 0xffff000000001000)
			var st strapOffcpuStart
			if err := p.objs.OffcpuStarts.Lookup(uint32(0), &st); err != nil || st.Reason != 0 {
				t.Fatalf("after wakeup: stamp %+v, err %v; want reason runnable", st, err)
			}
			run(t, p.objs.SchedSwitch, 0, 0xffff000000002000, 0xffff000000001000, 0)
			var ts strapThreadStats
			if err := p.objs.ThreadStatsMap.Lookup(uint32(0), &ts); err != nil {
				t.Fatal(err)
			}
			if got := tc.check(ts); got < blocked || got > blocked+50e6 {
				t.Errorf("%s ns = %d, want about %d", tc.name, got, uint64(blocked))
			}
			if ts.Tgid != 42 || ts.RunnableNs == 0 || ts.RunnableNs > 50e6 {
				t.Errorf("thread stats %+v: want tgid 42 and a small runnable time", ts)
			}
			// The entry stays (written in place at the next switch-out) but holds no stamp.
			if err := p.objs.OffcpuStarts.Lookup(uint32(0), &st); err == nil && st.Reason != offNone {
				t.Errorf("stamp left after switch-in: %+v", st)
			}
			// The runnable part, and only it, is one run-queue wait of the thread group.
			var rq strapLatStats
			if err := p.objs.RunqStats.Lookup(uint32(42), &rq); err != nil {
				t.Fatal(err)
			}
			var inSlots uint64
			for _, n := range rq.Slots {
				inSlots += n
			}
			if rq.Count != 1 || rq.Timed != 1 || inSlots != 1 || rq.TotalNs != ts.RunnableNs {
				t.Errorf("run-queue stats %+v: want one wait of %d ns", rq, ts.RunnableNs)
			}
			_ = p.objs.RunqStats.Delete(uint32(42))
		})
	}
}

// TestProgFilter runs the page-fault and syscall-entry programs in the test's own
// context (prog.Run executes them as the calling thread): only a watched tgid counts.
func TestProgFilter(t *testing.T) {
	p := loadedProbes(t)
	runtime.LockOSThread() // the pending entry is keyed by this thread's id
	defer runtime.UnlockOSThread()
	self := uint32(os.Getpid())
	faults := func() uint64 {
		var ps strapProcStats
		_ = p.objs.ProcStatsMap.Lookup(self, &ps)
		return ps.PageFaults
	}
	run(t, p.objs.PageFaultUser, 0x1000, 0, 6)
	if got := faults(); got != 0 {
		t.Fatalf("unwatched process counted %d faults", got)
	}
	if err := p.watch(self); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		run(t, p.objs.PageFaultUser, 0x1000, 0, 6)
	}
	if got := faults(); got != 3 {
		t.Fatalf("watched process: %d faults, want 3", got)
	}

	pending := func() int { return mapLen[uint32, strapPendingSyscall](t, p.objs.PendingSyscalls) }
	// Every syscall of a watched thread is stamped (its latency is timed at exit); one
	// entry per thread, the last syscall wins. The fake regs read as zeros, so futex's op
	// reads as FUTEX_WAIT and ioctl's fd as 0 (this test's stdin, not an nvidia file).
	for _, tc := range []struct {
		nr    uint64
		kind  uint32
		flags uint32
	}{
		{39, 0xff, 1},  // getpid: no sync wait
		{9, 0xff, 1},   // mmap
		{202, 0, 1},    // futex, FUTEX_WAIT
		{232, 1, 1},    // epoll_wait
		{7, 2, 1},      // poll
		{271, 3, 1},    // ppoll
		{230, 4, 1},    // clock_nanosleep
		{16, 0xff, 1},  // ioctl on fd 0
		{257, 0xff, 1}, // openat
	} {
		run(t, p.objs.SysEnter, 0, tc.nr)
		if got := pending(); got != 1 {
			t.Fatalf("nr %d: pending entries = %d, want 1", tc.nr, got)
		}
		var ps strapPendingSyscall
		if err := p.objs.PendingSyscalls.Lookup(uint32(unix.Gettid()), &ps); err != nil || ps.Nr != int64(tc.nr) ||
			ps.SyncKind != tc.kind || ps.Flags != tc.flags || ps.Ts == 0 {
			t.Fatalf("pending for this thread = %+v (%v), want nr %d sync kind %d flags %d", ps, err, tc.nr, tc.kind, tc.flags)
		}
	}
	if err := p.unwatch(self); err != nil {
		t.Fatal(err)
	}
	_ = p.objs.PendingSyscalls.Delete(uint32(unix.Gettid()))
	run(t, p.objs.SysEnter, 0, 9)
	if got := pending(); got != 0 {
		t.Fatalf("unwatched process left %d pending entries", got)
	}
}

// TestProgTCPRetransmit: a retransmit runs in softirq or timer context, so the probe
// charges it to the watched process recorded as the socket's owner when it last moved
// data, and ignores sockets no watched process used. Retransmits cannot be caused on
// loopback without dropping packets, so the program runs on a fake socket pointer.
func TestProgTCPRetransmit(t *testing.T) {
	p := loadedProbes(t)
	const sk, tgid = uint64(0xffff000000d00000), uint32(4242)
	if err := p.objs.SockOwner.Put(sk, tgid); err != nil {
		t.Fatal(err)
	}
	retrans := func() uint64 {
		var ts strapTcpStats
		_ = p.objs.TcpStatsMap.Lookup(tgid, &ts)
		return ts.Retransmits
	}
	run(t, p.objs.TcpRetransmitSkb, sk, 0)
	run(t, p.objs.TcpRetransmitSkb, sk, 0)
	if got := retrans(); got != 2 {
		t.Fatalf("retransmits of the owned socket = %d, want 2", got)
	}
	run(t, p.objs.TcpRetransmitSkb, sk+0x1000, 0)
	if got := retrans(); got != 2 {
		t.Fatalf("a retransmit on a socket no watched process used was charged: %d", got)
	}
	if n := mapLen[uint32, strapTcpStats](t, p.objs.TcpStatsMap); n != 1 {
		t.Fatalf("%d tcp stats entries, want 1", n)
	}
}

// TestProcTotalsBatched: the per-TOKEN reading sums exactly the process's entries of the
// thread and syscall tables, read in batches; more entries than one batch holds, and
// entries of another process beside them.
func TestProcTotalsBatched(t *testing.T) {
	p := loadedProbes(t)
	const tgid, other = uint32(4242), uint32(77)
	var want ProcessTotals
	for tid := uint32(1); tid <= 3*batchChunk+17; tid++ {
		owner := tgid
		if tid%5 == 0 {
			owner = other
		}
		v := strapThreadStats{Tgid: owner, RunnableNs: uint64(tid), SleepNs: 2 * uint64(tid), IoNs: 3 * uint64(tid)}
		if err := p.objs.ThreadStatsMap.Put(tid, v); err != nil {
			t.Fatal(err)
		}
		if owner == tgid {
			want.OffCPU.RunnableNs += v.RunnableNs
			want.OffCPU.SleepNs += v.SleepNs
			want.OffCPU.IONs += v.IoNs
		}
	}
	for nr := uint32(0); nr < 300; nr++ {
		for _, pid := range []uint32{tgid, other} {
			v := strapLatStats{Count: uint64(nr) + 1, Timed: uint64(nr), TotalNs: 1000 * uint64(nr)}
			if err := p.objs.SyscallStats.Put(strapTgidKey{Tgid: pid, Id: nr}, v); err != nil {
				t.Fatal(err)
			}
			if pid == tgid {
				want.SyscallCount += v.Count
				want.SyscallTimed += v.Timed
				want.SyscallNs += v.TotalNs
			}
		}
	}
	if err := p.objs.ProcStatsMap.Put(tgid, strapProcStats{PageFaults: 99}); err != nil {
		t.Fatal(err)
	}
	want.PageFaults = 99
	for range 2 { // the second reading reuses the buffers
		got, err := p.procTotals(tgid)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("procTotals = %+v, want %+v", got, want)
		}
	}
}

// TestProgTotals: for a process watched with totals, sys_exit and the off-CPU accounting
// also add to its per-process totals (what a TOKEN reads with one lookup); a process
// watched without them gets none.
func TestProgTotals(t *testing.T) {
	p := loadedProbes(t)
	runtime.LockOSThread() // the pending entry is keyed by this thread's id
	defer runtime.UnlockOSThread()
	self := uint32(os.Getpid())
	if err := p.watch(self); err != nil {
		t.Fatal(err)
	}
	run(t, p.objs.SysEnter, 0, 39)
	run(t, p.objs.SysExit, 0, 0)
	if got, err := p.procTotalsKernel(self); err != nil || got.SyscallCount != 0 {
		t.Fatalf("watched without totals: %+v, %v; want no totals", got, err)
	}
	if err := p.watchTotals(self); err != nil {
		t.Fatal(err)
	}
	run(t, p.objs.SysEnter, 0, 39) // getpid, stamped and timed
	run(t, p.objs.SysExit, 0, 0)
	run(t, p.objs.SysExit, 0, 0) // an exit without its entry: counted, not timed
	got, err := p.procTotalsKernel(self)
	if err != nil {
		t.Fatal(err)
	}
	if got.SyscallCount != 2 || got.SyscallTimed != 1 || got.SyscallNs == 0 || got.SyscallNs > 50e6 {
		t.Fatalf("totals %+v: want 2 syscalls, 1 timed for a few µs", got)
	}

	for _, tc := range []struct {
		name   string
		totals uint32
	}{{"with totals", 1}, {"without", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			const tgid = uint32(4343)
			before, _ := p.procTotalsKernel(tgid)
			const blocked = 200e6
			if err := p.objs.OffcpuStarts.Put(uint32(0), strapOffcpuStart{Ts: monoNow(t) - blocked, Reason: 1, Tgid: tgid,
				Totals: tc.totals}); err != nil {
				t.Fatal(err)
			}
			run(t, p.objs.SchedWakeup, 0xffff000000001000)
			run(t, p.objs.SchedSwitch, 0, 0xffff000000002000, 0xffff000000001000, 0)
			after, err := p.procTotalsKernel(tgid)
			if err != nil {
				t.Fatal(err)
			}
			sleep, runnable := after.OffCPU.SleepNs-before.OffCPU.SleepNs, after.OffCPU.RunnableNs-before.OffCPU.RunnableNs
			if tc.totals == 0 {
				if sleep != 0 || runnable != 0 {
					t.Fatalf("totals grew without the flag: %+v", after)
				}
				return
			}
			if sleep < blocked || sleep > blocked+50e6 || runnable == 0 || runnable > 50e6 {
				t.Fatalf("totals sleep %d runnable %d ns: want about %d and a little", sleep, runnable, uint64(blocked))
			}
		})
	}
}

// TestUnwatchForgetsPending: unwatching a process drops its threads' pending-syscall
// stamps, which sys_exit would otherwise take for a later call after a new Watch.
func TestUnwatchForgetsPending(t *testing.T) {
	p := loadedProbes(t)
	runtime.LockOSThread() // the pending entry is keyed by this thread's id
	defer runtime.UnlockOSThread()
	self, tid := os.Getpid(), uint32(unix.Gettid())
	if err := p.watch(uint32(self)); err != nil {
		t.Fatal(err)
	}
	run(t, p.objs.SysEnter, 0, 39)
	var ps strapPendingSyscall
	if err := p.objs.PendingSyscalls.Lookup(tid, &ps); err != nil || ps.Nr != 39 {
		t.Fatalf("pending before unwatch: %+v, %v; want nr 39", ps, err)
	}
	c := &Collector{opts: Options{ProcRoot: "/proc"}, probes: p, watched: map[int]bool{self: true}}
	if err := c.unwatchLocked(self); err != nil {
		t.Fatal(err)
	}
	if err := p.objs.PendingSyscalls.Lookup(tid, &ps); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("pending after unwatch: %+v, %v; want none", ps, err)
	}
}
