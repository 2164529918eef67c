//go:build linux && (amd64 || arm64)

package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/trace"
)

// staleAfter is how old an in-flight block request may get before read drops it: a
// request whose completion the probe missed (issued before a detach, say) would
// otherwise hold the in-flight gauge above 0 forever.
const staleAfter = 120e9 // ns

// offNone is OFF_NONE of bpf/strap.bpf.c: a thread's switch-out entry that holds no stamp
// (the probes keep entries across switch-ins and write them in place).
const offNone = 3

// probes is the loaded BPF object with its attached links.
type probes struct {
	objs     strapObjects
	links    []link.Link
	stats    interface{ Close() error }
	statsErr string
	ring     *ringbuf.Reader
	done     chan struct{}
	sampleRW uint32 // the sample_rw constant: time one read/write in this many

	tok tokenBufs // procTotals' buffers

	mu        sync.Mutex
	opens     []trace.DeviceOpen
	opensLost uint64
}

// attachPoints maps each program to its raw tracepoint.
func (p *probes) attachPoints() map[string]*ebpf.Program {
	return map[string]*ebpf.Program{
		"block_rq_issue":     p.objs.BlockRqIssue,
		"block_rq_complete":  p.objs.BlockRqComplete,
		"block_rq_requeue":   p.objs.BlockRqRequeue,
		"sched_switch":       p.objs.SchedSwitch,
		"sched_wakeup":       p.objs.SchedWakeup,
		"sched_migrate_task": p.objs.SchedMigrateTask,
		"page_fault_user":    p.objs.PageFaultUser,
		"sys_enter":          p.objs.SysEnter,
		"sys_exit":           p.objs.SysExit,
		"sched_process_exit": p.objs.SchedProcessExit,
		"sched_wakeup_new":   p.objs.SchedWakeupNew,
		"sock_send_length":   p.objs.SockSendLength,
		"sock_recv_length":   p.objs.SockRecvLength,
		"tcp_retransmit_skb": p.objs.TcpRetransmitSkb,
	}
}

// loadProbes loads the object and attaches every program it can. A nil probes with an
// error means nothing loaded (no CAP_BPF, no BTF…); otherwise failed names the programs
// that would not attach.
func loadProbes(sampleRW uint32) (*probes, map[string]error, error) {
	// Only kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; where raising it fails
	// (no CAP_SYS_RESOURCE) the load below reports the real problem.
	memlockErr := rlimit.RemoveMemlock()
	p := &probes{done: make(chan struct{}), sampleRW: sampleRW}
	if err := p.load(); err != nil {
		if memlockErr != nil && !errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (and raising RLIMIT_MEMLOCK failed: %v)", err, memlockErr)
		}
		return nil, nil, err
	}
	failed := map[string]error{}
	for name, prog := range p.attachPoints() {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: name, Program: prog})
		if err != nil {
			failed[name] = err
			continue
		}
		p.links = append(p.links, l)
	}
	if st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME); err != nil {
		p.statsErr = fmt.Sprintf("enable run-time stats: %v", err)
	} else {
		p.stats = st
	}
	r, err := ringbuf.NewReader(p.objs.OpenEvents)
	if err != nil {
		p.close()
		return nil, nil, fmt.Errorf("open events ring: %w", err)
	}
	p.ring = r
	go p.readOpens()
	return p, failed, nil
}

// load loads the collection without attaching anything (tests run programs directly).
func (p *probes) load() error {
	spec, err := loadStrap()
	if err != nil {
		return fmt.Errorf("load bpf spec: %w", err)
	}
	if err := setSyscallNrs(spec); err != nil {
		return fmt.Errorf("load bpf spec: %w", err)
	}
	if p.sampleRW > 1 {
		v, ok := spec.Variables["sample_rw"]
		if !ok {
			return errors.New("load bpf spec: no sample_rw variable")
		}
		if err := v.Set(p.sampleRW); err != nil {
			return fmt.Errorf("set sample_rw: %w", err)
		}
	}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load bpf programs: %w", err)
		}
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("load bpf programs: needs CAP_BPF and CAP_PERFMON (uid %d has not): %w", os.Geteuid(), err)
		}
		return fmt.Errorf("load bpf programs: %w", err)
	}
	return nil
}

// setSyscallNrs writes this architecture's syscall numbers into the object's nr_*
// constants; the object's defaults are x86_64's.
func setSyscallNrs(spec *ebpf.CollectionSpec) error {
	for name, nr := range syscallNrs {
		v, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("no %s variable", name)
		}
		if err := v.Set(nr); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

func (p *probes) readOpens() {
	defer close(p.done)
	for {
		rec, err := p.ring.Read()
		if err != nil {
			return // ringbuf.ErrClosed on close
		}
		var e strapOpenEvent
		if len(rec.RawSample) < 16+len(e.Path) {
			continue
		}
		b := rec.RawSample
		ev := trace.DeviceOpen{
			PID: int(ne.Uint32(b[0:4])), TID: int(ne.Uint32(b[4:8])), Ret: int64(ne.Uint64(b[8:16])),
		}
		path := b[16 : 16+len(e.Path)]
		if i := bytes.IndexByte(path, 0); i >= 0 {
			path = path[:i]
		}
		ev.Path = string(path)
		p.mu.Lock()
		if len(p.opens) < 4*maxOpensPerInterval {
			p.opens = append(p.opens, ev)
		} else {
			p.opensLost++
		}
		p.mu.Unlock()
	}
}

// drainOpens returns up to max device opens since the last call and how many were lost.
func (p *probes) drainOpens(max int) ([]trace.DeviceOpen, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.opens
	lost := p.opensLost
	if len(out) > max {
		lost += uint64(len(out) - max)
		out = out[:max]
	}
	p.opens, p.opensLost = nil, 0
	return out, lost
}

// Values of watched_tgids (WATCH_* in bpf/strap.bpf.c).
const (
	watchOn     = uint8(1)
	watchTotals = uint8(2)
)

func (p *probes) watch(tgid uint32) error {
	return p.objs.WatchedTgids.Put(tgid, watchOn)
}

// watchTotals has the probes keep tgid's per-process totals (procTotalsKernel).
func (p *probes) watchTotals(tgid uint32) error {
	return p.objs.WatchedTgids.Put(tgid, watchOn|watchTotals)
}

// procTotalsKernel reads the totals the probes keep for a watchTotals process: one lookup.
func (p *probes) procTotalsKernel(tgid uint32) (ProcessTotals, error) {
	var pv strapProcStats
	if err := p.objs.ProcStatsMap.Lookup(tgid, &pv); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return ProcessTotals{}, nil // nothing counted yet
		}
		return ProcessTotals{}, fmt.Errorf("proc stats: %w", err)
	}
	return ProcessTotals{
		OffCPU:     trace.OffCPU{RunnableNs: pv.TotRunnableNs, SleepNs: pv.TotSleepNs, IONs: pv.TotIoNs},
		PageFaults: pv.PageFaults, SyscallCount: pv.TotSyscalls, SyscallTimed: pv.TotTimed, SyscallNs: pv.TotSyscallNs,
	}, nil
}

func (p *probes) unwatch(tgid uint32) error {
	err := p.objs.WatchedTgids.Delete(tgid)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

func (p *probes) watchCgroup(id uint64) error {
	if err := p.objs.WatchedCgroups.Put(id, uint8(1)); err != nil {
		return err
	}
	var n uint32
	iter := p.objs.WatchedCgroups.Iterate()
	var k uint64
	var v uint8
	for iter.Next(&k, &v) {
		n++
	}
	return p.objs.Cfg.Put(uint32(0), n)
}

// read takes the cumulative counters of every map; with sweep it also deletes in-flight
// entries older than staleAfter (counted in rawCounters.stale).
func (p *probes) read(sweep bool) (rawCounters, error) {
	raw := rawCounters{
		devs: map[uint32]devCounters{}, inflight: map[uint32]int64{},
		threads: map[uint32]threadCounters{}, procs: map[uint32]procCounters{},
		syscalls: map[tgidID]latCounters{}, syncs: map[tgidID]latCounters{}, runq: map[uint32]latCounters{},
		ioctl: map[uint32]latCounters{}, tcp: map[uint32]trace.TCP{},
	}
	var errs []error

	var dk uint32
	var dv strapDevStats
	it := p.objs.DevStatsMap.Iterate()
	for it.Next(&dk, &dv) {
		raw.devs[dk] = devCounters{ios: dv.Ios, bytes: dv.Bytes, slots: dv.Slots}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("dev stats: %w", err))
	}

	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	now := uint64(ts.Nano())
	var rk uint64
	var rv strapRqStart
	var stale []uint64
	it = p.objs.RqStarts.Iterate()
	for it.Next(&rk, &rv) {
		if sweep && now > rv.Ts && now-rv.Ts > staleAfter {
			stale = append(stale, rk)
			continue
		}
		raw.inflight[rv.Dev]++
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("in-flight requests: %w", err))
	}
	for _, k := range stale {
		if p.objs.RqStarts.Delete(k) == nil {
			raw.stale++
		}
	}

	var tk uint32
	var tv strapThreadStats
	it = p.objs.ThreadStatsMap.Iterate()
	for it.Next(&tk, &tv) {
		raw.threads[tk] = threadCounters{tgid: tv.Tgid, runnable: tv.RunnableNs, sleep: tv.SleepNs, io: tv.IoNs,
			nvcsw: tv.Nvcsw, nivcsw: tv.Nivcsw, migration: tv.Migrations, crossNode: tv.CrossNode}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("thread stats: %w", err))
	}

	var pk uint32
	var pv strapProcStats
	it = p.objs.ProcStatsMap.Iterate()
	for it.Next(&pk, &pv) {
		raw.procs[pk] = procCounters{pageFaults: pv.PageFaults, sys: trace.Syscalls{
			MmapCount: pv.MmapCount, MmapBytes: pv.MmapBytes, MlockCount: pv.MlockCount, MlockBytes: pv.MlockBytes,
			MunlockCount: pv.MunlockCount, MunlockBytes: pv.MunlockBytes, OpenatCount: pv.OpenatCount,
			OpenatFailed: pv.OpenatFailed, NvidiaOpens: pv.NvidiaOpens},
			exited: pv.Exited != 0, exitFaults: ProcFaults{Minor: pv.ExitMinFlt, Major: pv.ExitMajFlt}}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("proc stats: %w", err))
	}

	var lk strapTgidKey
	var lv strapLatStats
	for _, m := range []struct {
		name string
		m    *ebpf.Map
		dst  map[tgidID]latCounters
	}{{"syscall stats", p.objs.SyscallStats, raw.syscalls}, {"sync stats", p.objs.SyncStats, raw.syncs}} {
		it = m.m.Iterate()
		for it.Next(&lk, &lv) {
			m.dst[tgidID{lk.Tgid, lk.Id}] = latFrom(lv)
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.name, err))
		}
	}
	for _, m := range []struct {
		name string
		m    *ebpf.Map
		dst  map[uint32]latCounters
	}{{"runq stats", p.objs.RunqStats, raw.runq}, {"ioctl stats", p.objs.IoctlStats, raw.ioctl}} {
		it = m.m.Iterate()
		for it.Next(&pk, &lv) {
			m.dst[pk] = latFrom(lv)
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.name, err))
		}
	}
	var tv2 strapTcpStats
	it = p.objs.TcpStatsMap.Iterate()
	for it.Next(&pk, &tv2) {
		raw.tcp[pk] = trace.TCP{TxBytes: tv2.TxBytes, RxBytes: tv2.RxBytes, TxCalls: tv2.TxCalls, RxCalls: tv2.RxCalls,
			Retransmits: tv2.Retransmits}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("tcp stats: %w", err))
	}

	for i := range raw.errs {
		var v uint64
		if err := p.objs.Errs.Lookup(uint32(i), &v); err == nil {
			raw.errs[i] = v
		}
	}

	for name, prog := range p.attachPoints() {
		st, err := prog.Stats()
		if err != nil {
			continue
		}
		raw.progs = append(raw.progs, trace.ProgStats{Program: name, TotalEvents: st.RunCount,
			TotalRunTimeNs: uint64(st.Runtime), RecursionMisses: st.RecursionMisses})
	}
	sortProgs(raw.progs)
	return raw, errors.Join(errs...)
}

func latFrom(v strapLatStats) latCounters {
	return latCounters{count: v.Count, errors: v.Errors, timed: v.Timed, totalNs: v.TotalNs, slots: v.Slots}
}

// forgetProcess drops a process's counters (it exited or is no longer watched).
func (p *probes) forgetProcess(tgid uint32) {
	_ = p.objs.ProcStatsMap.Delete(tgid)
	_ = p.objs.RunqStats.Delete(tgid)
	_ = p.objs.IoctlStats.Delete(tgid)
	_ = p.objs.TcpStatsMap.Delete(tgid)
	for _, m := range []*ebpf.Map{p.objs.SyscallStats, p.objs.SyncStats} {
		var k strapTgidKey
		var v strapLatStats
		var dead []strapTgidKey
		it := m.Iterate()
		for it.Next(&k, &v) {
			if k.Tgid == tgid {
				dead = append(dead, k)
			}
		}
		for _, k := range dead {
			_ = m.Delete(k)
		}
	}
}

// forgetPending drops a thread's pending-syscall stamp.
func (p *probes) forgetPending(tid uint32) {
	_ = p.objs.PendingSyscalls.Delete(tid)
}

// forgetThread drops an exited thread's entries.
func (p *probes) forgetThread(tid uint32) {
	_ = p.objs.ThreadStatsMap.Delete(tid)
	_ = p.objs.OffcpuStarts.Delete(tid)
	_ = p.objs.PendingSyscalls.Delete(tid)
}

// sweepThreads drops switch-out stamps and pending syscalls of threads that are gone
// (a thread that exits while switched out, or inside a traced syscall, leaves one).
func (p *probes) sweepThreads(alive func(tid uint32) bool) {
	var dead []uint32
	var k uint32
	var ov strapOffcpuStart
	it := p.objs.OffcpuStarts.Iterate()
	for it.Next(&k, &ov) {
		if !alive(k) {
			dead = append(dead, k)
		}
	}
	var pv strapPendingSyscall
	it = p.objs.PendingSyscalls.Iterate()
	for it.Next(&k, &pv) {
		if !alive(k) {
			dead = append(dead, k)
		}
	}
	for _, tid := range dead {
		p.forgetThread(tid)
	}
}

func (p *probes) close() error {
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	p.links = nil
	if p.ring != nil {
		errs = append(errs, p.ring.Close())
		<-p.done
	}
	if p.stats != nil {
		errs = append(errs, p.stats.Close())
	}
	errs = append(errs, p.objs.Close())
	return errors.Join(errs...)
}

// procTotals sums one process's cumulative counters: its threads' off-CPU time, its user
// page faults, and its syscalls' count and timed time. It runs at every TOKEN of a traced
// session, so the two tables are read with BPF_MAP_LOOKUP_BATCH (one system call per 256
// entries, into buffers kept between calls) rather than iterated (two system calls per
// entry: with strapd's and a torch client's threads and syscalls, about a millisecond per
// TOKEN). An exited thread whose entry was already removed is no longer in the sum.
func (p *probes) procTotals(tgid uint32) (ProcessTotals, error) {
	var out ProcessTotals
	var errs []error
	var err error
	p.tok.tids, p.tok.threads, err = readAll(p.objs.ThreadStatsMap, p.tok.tids, p.tok.threads)
	if err != nil {
		errs = append(errs, fmt.Errorf("thread stats: %w", err))
	}
	for _, tv := range p.tok.threads {
		if tv.Tgid == tgid {
			out.OffCPU.RunnableNs += tv.RunnableNs
			out.OffCPU.SleepNs += tv.SleepNs
			out.OffCPU.IONs += tv.IoNs
		}
	}
	var pv strapProcStats
	if err := p.objs.ProcStatsMap.Lookup(tgid, &pv); err == nil {
		out.PageFaults = pv.PageFaults
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, fmt.Errorf("proc stats: %w", err))
	}
	p.tok.sysKeys, p.tok.sysVals, err = readAll(p.objs.SyscallStats, p.tok.sysKeys, p.tok.sysVals)
	if err != nil {
		errs = append(errs, fmt.Errorf("syscall stats: %w", err))
	}
	for i, lk := range p.tok.sysKeys {
		if lk.Tgid == tgid {
			lv := &p.tok.sysVals[i]
			out.SyscallCount += lv.Count
			out.SyscallTimed += lv.Timed
			out.SyscallNs += lv.TotalNs
		}
	}
	return out, errors.Join(errs...)
}

// tokenBufs are procTotals' buffers, reused between TOKENs (the Collector's mutex guards them).
type tokenBufs struct {
	tids    []uint32
	threads []strapThreadStats
	sysKeys []strapTgidKey
	sysVals []strapLatStats
}

// batchChunk is how many entries one BPF_MAP_LOOKUP_BATCH call returns at most; a hash
// map's bucket must fit in it (ENOSPC otherwise), which any chunk above a handful does.
const batchChunk = 256

// readAll reads every entry of a hash map into keys and vals (their backing arrays reused),
// in chunks of batchChunk entries per system call; on a kernel without batch lookups it
// falls back to iterating.
func readAll[K any, V any](m *ebpf.Map, keys []K, vals []V) ([]K, []V, error) {
	keys, vals = keys[:0], vals[:0]
	var cursor ebpf.MapBatchCursor
	for {
		keys, vals = slices.Grow(keys, batchChunk), slices.Grow(vals, batchChunk)
		nk, nv := len(keys), len(vals)
		n, err := m.BatchLookup(&cursor, keys[nk:nk+batchChunk], vals[nv:nv+batchChunk], nil)
		keys, vals = keys[:nk+n], vals[:nv+n]
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return keys, vals, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
			break
		}
		if err != nil {
			return keys, vals, err
		}
	}
	keys, vals = keys[:0], vals[:0]
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys, vals = append(keys, k), append(vals, v)
	}
	return keys, vals, it.Err()
}

// takeWeightOpen returns and deletes tgid's first weight-file open.
func (p *probes) takeWeightOpen(tgid uint32) (weightOpen, bool, error) {
	var v strapWeightOpen
	if err := p.objs.WeightOpens.Lookup(tgid, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return weightOpen{}, false, nil
		}
		return weightOpen{}, false, fmt.Errorf("weight opens: %w", err)
	}
	if err := p.objs.WeightOpens.Delete(tgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return weightOpen{}, false, fmt.Errorf("weight opens: %w", err)
	}
	path := make([]byte, 0, len(v.Path))
	for _, c := range v.Path {
		if c == 0 {
			break
		}
		path = append(path, byte(c))
	}
	return weightOpen{Path: string(path), BootNs: v.Ts, StartBoot: v.StartBoot}, true, nil
}

// setCPUNodes loads the CPU → NUMA node map the migration probe compares; CPUs past the
// map's size are left at node 0.
func (p *probes) setCPUNodes(nodes map[int]int) error {
	for cpu, node := range nodes {
		if cpu < 0 || cpu >= int(p.objs.CpuNode.MaxEntries()) || node < 0 {
			continue
		}
		if err := p.objs.CpuNode.Put(uint32(cpu), uint32(node)); err != nil {
			return fmt.Errorf("cpu_node[%d]: %w", cpu, err)
		}
	}
	return nil
}
