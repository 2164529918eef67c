package bpf

import (
	"encoding/binary"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/trace"
)

// maxSlots is the number of log2 latency slots kept by the probes.
const maxSlots = 32

// numDrops is len(dropNames).
const numDrops = 8

// maxOpensPerInterval bounds DeviceOpens in one snapshot; the rest are counted in Drops.
const maxOpensPerInterval = 1024

// dropNames maps the probes' error counters (errs map index) to Drops keys.
var dropNames = []string{"rq_map_full", "thread_map_full", "proc_map_full", "dev_map_full", "ringbuf_full", "pending_map_full",
	"syscall_map_full", "stats_map_full"}

type devCounters struct {
	ios, bytes [3]uint64
	slots      [maxSlots]uint64
}

type threadCounters struct {
	tgid                                                     uint32
	runnable, sleep, io, nvcsw, nivcsw, migration, crossNode uint64
}

type procCounters struct {
	pageFaults uint64
	sys        trace.Syscalls
	// exited is set by the probe when the last thread exited; exitFaults are then the
	// lifetime counters /proc would have shown.
	exited     bool
	exitFaults ProcFaults
}

// rawCounters is one read of the probes' cumulative maps.
type rawCounters struct {
	devs     map[uint32]devCounters
	inflight map[uint32]int64
	threads  map[uint32]threadCounters
	procs    map[uint32]procCounters
	syscalls map[tgidID]latCounters // by (tgid, syscall number)
	syncs    map[tgidID]latCounters // by (tgid, sync-wait kind)
	runq     map[uint32]latCounters
	ioctl    map[uint32]latCounters
	tcp      map[uint32]trace.TCP
	errs     [numDrops]uint64
	stale    uint64 // in-flight entries older than staleAfter, deleted by read
	progs    []trace.ProgStats
}

// Snapshot returns the kernel behaviour since the previous Snapshot (or Start). It never
// fails: a source that cannot be read leaves its fields empty and the reason is in Status.
func (c *Collector) Snapshot() trace.Snapshot {
	c.mu.Lock()
	sessFn := c.sessions
	c.mu.Unlock()
	sessions := []trace.Session{}
	if sessFn != nil {
		if got := sessFn(); got != nil {
			sessions = got
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	s := trace.NewSnapshot()
	s.Sessions = sessions
	s.Stamp(now, now.Sub(c.last))
	c.last = now
	for _, name := range collectorOrder {
		s.Collectors[name] = c.status[name].Source
	}
	if c.closed {
		return s
	}

	var raw rawCounters
	if c.probes != nil {
		var err error
		if raw, err = c.probes.read(true); err != nil {
			c.log.Warn("read probes", zap.Error(err))
		}
		opens, lost := c.probes.drainOpens(maxOpensPerInterval)
		s.DeviceOpens = append(s.DeviceOpens, opens...)
		if lost > 0 {
			s.Drops["device_opens_over_limit"] = lost
		}
		for i, name := range dropNames {
			if d := sub(raw.errs[i], c.prev.errs[i]); d > 0 {
				s.Drops[name] = d
			}
		}
		if raw.stale > 0 {
			s.Drops["rq_stale"] = raw.stale
		}
		for _, p := range raw.progs {
			prev := c.prevStats[p.Program]
			p.Events = sub(p.TotalEvents, prev.TotalEvents)
			p.RunTimeNs = sub(p.TotalRunTimeNs, prev.TotalRunTimeNs)
			p.NsPerEvent = nsPer(p.RunTimeNs, p.Events)
			c.prevStats[p.Program] = p
			s.BPFStats = append(s.BPFStats, p)
		}
	}

	c.blockIO(&s, raw)
	c.perProcess(&s, raw)

	if c.status[trace.CollectorPressure].Source == trace.SourceProc {
		if p, err := ReadPSI(c.opts.ProcRoot); err == nil && len(p) > 0 {
			s.Pressure = p
		}
	}
	c.prev = raw
	s.Watched = c.watchedList()
	return s
}

func (c *Collector) blockIO(s *trace.Snapshot, raw rawCounters) {
	secs := s.IntervalS
	rate := func(n uint64) float64 {
		if secs <= 0 {
			return 0
		}
		return float64(n) / secs
	}
	switch c.status[trace.CollectorBlockIO].Source {
	case trace.SourceBPF:
		devs := slices.Sorted(maps.Keys(raw.devs))
		for _, dev := range devs {
			cur, prev := raw.devs[dev], c.prev.devs[dev]
			name := c.devs.name(dev)
			h := trace.DeviceHistogram{DeviceName: name, Device: devString(dev), Buckets: []trace.Bucket{}}
			for slot := range maxSlots {
				n := sub(cur.slots[slot], prev.slots[slot])
				if n == 0 {
					continue
				}
				h.Total += n
				h.Buckets = append(h.Buckets, trace.Bucket{Slot: slot, Count: n, BucketLow: (uint64(1) << slot) >> 1, BucketHigh: uint64(1)<<slot - 1})
			}
			io := trace.DeviceIO{DeviceName: name,
				ReadIOs: sub(cur.ios[0], prev.ios[0]), WriteIOs: sub(cur.ios[1], prev.ios[1]), OtherIOs: sub(cur.ios[2], prev.ios[2]),
				ReadBytes: sub(cur.bytes[0], prev.bytes[0]), WriteBytes: sub(cur.bytes[1], prev.bytes[1]), OtherBytes: sub(cur.bytes[2], prev.bytes[2]),
			}
			io.ReadIOPS, io.WriteIOPS = rate(io.ReadIOs), rate(io.WriteIOs)
			if h.Total == 0 {
				continue
			}
			s.LatencyHistogram = append(s.LatencyHistogram, h)
			s.BlockIO = append(s.BlockIO, io)
		}
		// Every device with a request in flight, or with completions this interval.
		seen := map[uint32]bool{}
		for _, dev := range devs {
			if raw.inflight[dev] > 0 || sub(sumSlots(raw.devs[dev]), sumSlots(c.prev.devs[dev])) > 0 {
				seen[dev] = true
			}
		}
		for dev, n := range raw.inflight {
			if n > 0 {
				seen[dev] = true
			}
		}
		for _, dev := range slices.Sorted(maps.Keys(seen)) {
			s.Inflight = append(s.Inflight, trace.DeviceCount{DeviceName: c.devs.name(dev), Count: raw.inflight[dev]})
		}
	case trace.SourceProc:
		cur := c.readDiskstats()
		for _, dev := range slices.Sorted(maps.Keys(cur)) {
			d, p := cur[dev], c.prevDisk[dev]
			io := trace.DeviceIO{DeviceName: d.name,
				ReadIOs: sub(d.reads, p.reads), WriteIOs: sub(d.writes, p.writes),
				ReadBytes: sub(d.readBytes, p.readBytes), WriteBytes: sub(d.writeBytes, p.writeBytes)}
			io.ReadIOPS, io.WriteIOPS = rate(io.ReadIOs), rate(io.WriteIOs)
			if io.ReadIOs+io.WriteIOs > 0 {
				s.BlockIO = append(s.BlockIO, io)
			}
			if io.ReadIOs+io.WriteIOs > 0 || d.inflight > 0 {
				s.Inflight = append(s.Inflight, trace.DeviceCount{DeviceName: d.name, Count: d.inflight})
			}
		}
		c.prevDisk = cur
	}
}

func sumSlots(d devCounters) uint64 {
	var n uint64
	for _, v := range d.slots {
		n += v
	}
	return n
}

// readDiskstats reads /proc/diskstats, keeping whole disks only (as the probes do).
func (c *Collector) readDiskstats() map[uint32]diskStat {
	all, err := diskstats(c.blockFS)
	if err != nil {
		return nil
	}
	for dev := range all {
		if _, err := os.Stat(filepath.Join(c.opts.SysRoot, "dev/block", devString(dev), "partition")); err == nil {
			delete(all, dev)
		}
	}
	return all
}

func (c *Collector) perProcess(s *trace.Snapshot, raw rawCounters) {
	bpfFaults := c.status[trace.CollectorPageFaults].Source == trace.SourceBPF
	bpfSys := c.status[trace.CollectorSyscalls].Source == trace.SourceBPF
	bpfOff := c.status[trace.CollectorOffCPU].Source == trace.SourceBPF
	bpfSched := c.status[trace.CollectorSched].Source == trace.SourceBPF

	// Every process to report: the watched ones and any the kernel counted through a
	// watched cgroup.
	pids := map[int]bool{}
	for pid := range c.watched {
		pids[pid] = true
	}
	for tgid := range raw.procs {
		pids[int(tgid)] = true
	}
	for k := range raw.syscalls {
		pids[int(k.tgid)] = true
	}
	for _, m := range []map[uint32]latCounters{raw.runq, raw.ioctl} {
		for tgid := range m {
			pids[int(tgid)] = true
		}
	}
	for tgid := range raw.tcp {
		pids[int(tgid)] = true
	}
	for _, t := range raw.threads {
		pids[int(t.tgid)] = true
	}

	defer c.forgetThreadCPU(pids)
	defer c.pruneNUMARead(pids)
	for pid := range pids {
		key := pidKey(pid)
		alive := pidAlive(c.opts.ProcRoot, pid)
		var pf trace.PageFaults
		f, err := readProcFaults(c.procFS, pid)
		if pc := raw.procs[uint32(pid)]; err != nil && pc.exited {
			f, err = pc.exitFaults, nil
		}
		if err == nil {
			if prev, ok := c.prevProc[pid]; ok {
				pf.Minor, pf.Major = sub(f.Minor, prev.Minor), sub(f.Major, prev.Major)
			}
			c.prevProc[pid] = f
		}
		if bpfFaults {
			pf.Source = trace.SourceBPF
			pf.User = sub(raw.procs[uint32(pid)].pageFaults, c.prev.procs[uint32(pid)].pageFaults)
			s.PageFaults[key] = pf.User
		} else {
			pf.Source = trace.SourceProc
			s.PageFaults[key] = pf.Minor + pf.Major
		}
		s.PageFaultsDetail[key] = pf
		if bpfSys {
			cur, prev := raw.procs[uint32(pid)].sys, c.prev.procs[uint32(pid)].sys
			s.Syscalls[key] = trace.Syscalls{
				MmapCount: sub(cur.MmapCount, prev.MmapCount), MmapBytes: sub(cur.MmapBytes, prev.MmapBytes),
				MlockCount: sub(cur.MlockCount, prev.MlockCount), MlockBytes: sub(cur.MlockBytes, prev.MlockBytes),
				MunlockCount: sub(cur.MunlockCount, prev.MunlockCount), MunlockBytes: sub(cur.MunlockBytes, prev.MunlockBytes),
				OpenatCount: sub(cur.OpenatCount, prev.OpenatCount), OpenatFailed: sub(cur.OpenatFailed, prev.OpenatFailed),
				NvidiaOpens: sub(cur.NvidiaOpens, prev.NvidiaOpens),
			}
		}
		if bpfOff {
			s.OffCPU[key] = trace.OffCPU{}
			s.OffCPUNs[key] = 0
		}
		c.kernelStats(s, raw, pid, key)
		if alive {
			c.threadCPU(s, pid, key)
		}
		if alive && c.status[trace.CollectorMemory].Source == trace.SourceProc {
			if m, err := readMemory(c.procFS, pid); err == nil {
				s.Memory[key] = m
			}
		}
		if alive {
			c.numaPages(s, pid, key)
		}
		if bpfSched {
			s.Sched[key] = trace.Sched{Source: trace.SourceBPF}
		} else if v, i, err := ctxSwitches(c.procFS, pid); err == nil {
			sc := trace.Sched{Source: trace.SourceProc}
			if prev, ok := c.prevCtx[pid]; ok {
				sc.Voluntary, sc.Involuntary = sub(v, prev[0]), sub(i, prev[1])
			}
			c.prevCtx[pid] = [2]uint64{v, i}
			s.Sched[key] = sc
		}
		if !alive {
			// Its last counts are in this snapshot; forget it so the pid can be reused.
			_ = c.unwatchLocked(pid)
			delete(c.prevProc, pid)
			delete(c.prevCtx, pid)
			if c.probes != nil {
				c.probes.forgetProcess(uint32(pid))
				raw.forget(uint32(pid)) // a reused pid starts from zero
			}
		} else if !c.watched[pid] && len(c.cgroups) == 0 && c.probes != nil {
			c.probes.forgetProcess(uint32(pid)) // unwatched since the last snapshot
			raw.forget(uint32(pid))
		}
	}

	if c.probes == nil || (!bpfOff && !bpfSched) {
		return
	}
	for _, tid := range slices.Sorted(maps.Keys(raw.threads)) {
		cur, prev := raw.threads[tid], c.prev.threads[tid]
		if prev.tgid != cur.tgid {
			prev = threadCounters{}
		}
		t := trace.Thread{TID: int(tid), PID: int(cur.tgid),
			OffCPU:    trace.OffCPU{RunnableNs: sub(cur.runnable, prev.runnable), SleepNs: sub(cur.sleep, prev.sleep), IONs: sub(cur.io, prev.io)},
			Voluntary: sub(cur.nvcsw, prev.nvcsw), Involuntary: sub(cur.nivcsw, prev.nivcsw), Migrations: sub(cur.migration, prev.migration)}
		t.BlockedNs = t.SleepNs + t.IONs
		key := pidKey(t.PID)
		if bpfOff {
			o := s.OffCPU[key]
			o.RunnableNs += t.RunnableNs
			o.SleepNs += t.SleepNs
			o.IONs += t.IONs
			o.BlockedNs += t.BlockedNs
			s.OffCPU[key] = o
			s.OffCPUNs[key] = o.RunnableNs + o.BlockedNs
		}
		if bpfSched {
			sc := s.Sched[key]
			sc.Source = trace.SourceBPF
			sc.Voluntary += t.Voluntary
			sc.Involuntary += t.Involuntary
			sc.Migrations += t.Migrations
			if c.numaNodes > 1 {
				if s.NUMA == nil {
					s.NUMA = map[string]trace.NUMA{}
				}
				n := s.NUMA[key]
				n.CrossNodeMigrations += sub(cur.crossNode, prev.crossNode)
				s.NUMA[key] = n
			}
			s.Sched[key] = sc
		}
		if c.opts.PerThread && t.RunnableNs+t.BlockedNs+t.Voluntary+t.Involuntary+t.Migrations > 0 {
			s.Threads = append(s.Threads, t)
		}
		// Exited threads, and threads of processes no longer watched, are reported this
		// once and then forgotten.
		if !pidAlive(c.opts.ProcRoot, int(tid)) || (!c.watched[int(cur.tgid)] && len(c.cgroups) == 0) {
			c.probes.forgetThread(tid)
			delete(raw.threads, tid)
		}
	}
	c.probes.sweepThreads(func(tid uint32) bool { return pidAlive(c.opts.ProcRoot, int(tid)) })
}

// kernelStats adds pid's syscall, sync-wait, run-queue, nvidia ioctl and TCP numbers of
// the interval to s, for the collectors that run on bpf.
func (c *Collector) kernelStats(s *trace.Snapshot, raw rawCounters, pid int, key string) {
	tgid := uint32(pid)
	on := func(name string) bool { return c.status[name].Source == trace.SourceBPF }
	if on(trace.CollectorSyscallLatency) {
		if m := byTgid(raw.syscalls, c.prev.syscalls, tgid, syscallName); m != nil {
			s.SyscallLatency[key] = m
		}
	}
	if on(trace.CollectorSyncWait) {
		if m := byTgid(raw.syncs, c.prev.syncs, tgid, syncKindName); m != nil {
			s.SyncWait[key] = m
		}
	}
	if on(trace.CollectorRunqueue) {
		if l, ok := latDelta(raw.runq[tgid], c.prev.runq[tgid]); ok {
			s.RunqueueLatency[key] = l
		}
	}
	if on(trace.CollectorNvidiaIoctl) {
		if l, ok := latDelta(raw.ioctl[tgid], c.prev.ioctl[tgid]); ok {
			s.NvidiaIoctl[key] = l
		}
	}
	if on(trace.CollectorTCP) {
		if t, ok := tcpDelta(raw.tcp[tgid], c.prev.tcp[tgid]); ok {
			s.TCP[key] = t
		}
	}
}

// forget drops a process from a read, so that its next counts start from zero.
func (raw *rawCounters) forget(tgid uint32) {
	delete(raw.procs, tgid)
	delete(raw.runq, tgid)
	delete(raw.ioctl, tgid)
	delete(raw.tcp, tgid)
	for _, m := range []map[tgidID]latCounters{raw.syscalls, raw.syncs} {
		for k := range m {
			if k.tgid == tgid {
				delete(m, k)
			}
		}
	}
}

func sortProgs(p []trace.ProgStats) {
	slices.SortFunc(p, func(a, b trace.ProgStats) int {
		if a.Program < b.Program {
			return -1
		}
		if a.Program > b.Program {
			return 1
		}
		return 0
	})
}

// ne is the host byte order of the probes' records (the object is built little-endian).
var ne = binary.LittleEndian
