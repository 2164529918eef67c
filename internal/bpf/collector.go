package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"github.com/prometheus/procfs/blockdevice"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/trace"
)

// Options configures Start. The zero value traces block I/O and PSI system-wide and
// counts per-process events for nobody until Watch is called.
type Options struct {
	// PIDs are thread-group ids to watch from the start.
	PIDs []int
	// Cgroups are cgroup v2 directories (e.g. /sys/fs/cgroup/unified/my.slice) whose
	// member tasks are watched, matched in the kernel by cgroup id.
	Cgroups []string
	// WatchSelf adds the calling process (strapd) to the watched set.
	WatchSelf bool
	// PerThread adds the per-thread breakdown (Snapshot.Threads).
	PerThread bool
	// NoBPF skips the kernel probes and uses only the /proc fallbacks.
	NoBPF bool
	// SampleReadWrite times one read/write syscall in N (per CPU) in the syscall
	// latency histograms; counts and errors stay exact. 0 and 1 time every call.
	SampleReadWrite int
	// Logger receives one warning per collector that cannot attach; nil logs nothing. It
	// carries the caller's component (probes, trace, top): the collector adds none.
	Logger *zap.Logger
	// ProcRoot and SysRoot default to /proc and /sys (overridden by tests).
	ProcRoot, SysRoot string
	// CPUNodes maps CPU number to NUMA node for the cross-node migration count; nil reads
	// it from SysRoot/devices/system/node/node*/cpulist (tests pass a fake topology).
	CPUNodes map[int]int
	// NUMAMapsInterval is how often each watched process's resident pages per NUMA node
	// are read from /proc/<pid>/numa_maps (Snapshot.NUMAPages); 0 means
	// DefaultNUMAMapsInterval, negative never.
	NUMAMapsInterval time.Duration
}

// CollectorStatus reports how one collector runs.
type CollectorStatus struct {
	// Name is one of the Collector* constants.
	Name string `json:"name"`
	// Source is SourceBPF, SourceProc (fallback) or SourceOff.
	Source string `json:"source"`
	// Programs are the BPF programs the collector uses.
	Programs []string `json:"programs,omitempty"`
	// Error says why the BPF probes are not used (empty when Source is bpf).
	Error string `json:"error,omitempty"`
}

// Status is the Collector's health: which collectors run from which source, the
// watched set, and cumulative BPF run statistics (the probes' measured overhead).
type Status struct {
	// Collectors are in a fixed order: block_io, off_cpu, sched, page_faults, syscalls,
	// syscall_latency, sync_wait, runqueue, nvidia_ioctl, tcp, memory, pressure.
	Collectors []CollectorStatus `json:"collectors"`
	// Watched are the watched tgids, sorted; Cgroups the watched cgroup directories.
	Watched []int    `json:"watched"`
	Cgroups []string `json:"cgroups,omitempty"`
	// BPFStats are cumulative since load (Events = TotalEvents).
	BPFStats []trace.ProgStats `json:"bpf_stats"`
	// StatsError says why run statistics are unavailable, if they are.
	StatsError string `json:"stats_error,omitempty"`
	// Drops are cumulative events lost by the probes, by reason.
	Drops map[string]uint64 `json:"drops"`
}

// Collector gathers kernel behaviour into per-interval Snapshots. It is safe for
// concurrent use: the capture server calls Watch/Unwatch from session goroutines while a
// ticker calls Snapshot.
type Collector struct {
	opts   Options
	log    *zap.Logger
	probes *probes // nil when the kernel probes are unavailable

	mu        sync.Mutex
	closed    bool
	watched   map[int]bool
	cgroups   []string
	sessions  func() []trace.Session
	status    map[string]*CollectorStatus
	last      time.Time
	prev      rawCounters
	prevProc  map[int]ProcFaults
	prevCtx   map[int][2]uint64
	prevDisk  map[uint32]diskStat
	procFS    procfs.FS      // opts.ProcRoot
	blockFS   blockdevice.FS // opts.ProcRoot and opts.SysRoot
	devs      devNames
	prevStats map[string]trace.ProgStats
	// prevThreadCPU is each reported process's per-thread schedstat run time (tid -> ns).
	prevThreadCPU map[int]map[int]uint64
	// numaNodes is how many NUMA nodes the CPU topology given to the probes has.
	numaNodes int
	// numaRead is when each watched process's numa_maps was last read.
	numaRead map[int]time.Time
	// totals are the watched processes whose totals the probes keep (TrackTotals).
	totals map[int]bool
	// io reads ProcessTotals' /proc/<pid>/io.
	io procIO
}

// collectorPrograms lists the BPF programs each collector needs.
var collectorPrograms = map[string][]string{
	trace.CollectorBlockIO:        {"block_rq_issue", "block_rq_complete", "block_rq_requeue"},
	trace.CollectorOffCPU:         {"sched_switch", "sched_wakeup"},
	trace.CollectorSched:          {"sched_switch", "sched_migrate_task"},
	trace.CollectorPageFaults:     {"page_fault_user", "sched_process_exit"},
	trace.CollectorSyscalls:       {"sys_enter", "sys_exit"},
	trace.CollectorSyscallLatency: {"sys_enter", "sys_exit"},
	trace.CollectorSyncWait:       {"sys_enter", "sys_exit"},
	trace.CollectorNvidiaIoctl:    {"sys_enter", "sys_exit"},
	trace.CollectorRunqueue:       {"sched_switch", "sched_wakeup", "sched_wakeup_new"},
	trace.CollectorTCP:            {"sock_send_length", "sock_recv_length", "tcp_retransmit_skb"},
}

// collectorOrder is the order of Status().Collectors.
var collectorOrder = []string{trace.CollectorBlockIO, trace.CollectorOffCPU, trace.CollectorSched, trace.CollectorPageFaults, trace.CollectorSyscalls,
	trace.CollectorSyscallLatency, trace.CollectorSyncWait, trace.CollectorRunqueue, trace.CollectorNvidiaIoctl, trace.CollectorTCP, trace.CollectorMemory,
	trace.CollectorPressure}

// fallbacks says which /proc source replaces a collector whose probes failed.
var fallbacks = map[string]string{
	trace.CollectorBlockIO:        trace.SourceProc, // /proc/diskstats: IOPS, bytes, in-flight; no histogram
	trace.CollectorOffCPU:         trace.SourceOff,
	trace.CollectorSched:          trace.SourceProc, // /proc/<pid>/task/*/status ctxt switches; no migrations
	trace.CollectorPageFaults:     trace.SourceProc, // /proc/<pid>/stat minflt+majflt
	trace.CollectorSyscalls:       trace.SourceOff,
	trace.CollectorSyscallLatency: trace.SourceOff,
	trace.CollectorSyncWait:       trace.SourceOff,
	trace.CollectorNvidiaIoctl:    trace.SourceOff,
	trace.CollectorRunqueue:       trace.SourceOff,
	trace.CollectorTCP:            trace.SourceOff,
}

// Start loads and attaches the probes and returns a running Collector. Failing probes
// never fail Start: each collector that cannot attach is logged once, reported by
// Status with the reason, and replaced by its /proc fallback where one exists. Start
// fails only on bad options (a pid or cgroup that does not exist, a negative sampling
// factor).
func Start(opts Options) (*Collector, error) {
	if opts.SampleReadWrite < 0 {
		return nil, fmt.Errorf("sample read/write %d: must be 0 (every call) or positive", opts.SampleReadWrite)
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.SysRoot == "" {
		opts.SysRoot = "/sys"
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	c := &Collector{
		opts: opts, log: log, watched: map[int]bool{}, status: map[string]*CollectorStatus{},
		prevProc: map[int]ProcFaults{}, prevCtx: map[int][2]uint64{}, prevStats: map[string]trace.ProgStats{},
		prevThreadCPU: map[int]map[int]uint64{}, numaRead: map[int]time.Time{}, totals: map[int]bool{},
		devs: devNames{sysRoot: opts.SysRoot}, io: procIO{root: opts.ProcRoot},
	}
	var err error
	if c.procFS, err = procfs.NewFS(opts.ProcRoot); err != nil {
		return nil, fmt.Errorf("proc root: %w", err)
	}
	if c.blockFS, err = blockdevice.NewFS(opts.ProcRoot, opts.SysRoot); err != nil {
		return nil, fmt.Errorf("proc/sys root: %w", err)
	}
	var cgroupIDs []uint64
	for _, cg := range opts.Cgroups {
		id, err := cgroupID(cg)
		if err != nil {
			return nil, err
		}
		cgroupIDs = append(cgroupIDs, id)
		c.cgroups = append(c.cgroups, cg)
	}

	var loadErr error
	var failed map[string]error
	if opts.NoBPF {
		loadErr = errors.New("disabled by option")
	} else {
		c.probes, failed, loadErr = loadProbes(uint32(max(1, opts.SampleReadWrite)))
	}
	if c.probes != nil {
		nodes := opts.CPUNodes
		if nodes == nil {
			nodes = readCPUNodes(opts.SysRoot)
		}
		if err := c.probes.setCPUNodes(nodes); err != nil {
			c.log.Warn("cpu to NUMA node map not loaded; no cross-node migrations counted", zap.Error(err))
		} else {
			c.numaNodes = countNodes(nodes)
		}
	}
	for _, name := range collectorOrder {
		st := &CollectorStatus{Name: name, Programs: collectorPrograms[name], Source: trace.SourceBPF}
		if name == trace.CollectorMemory {
			st.Programs = nil
			st.Source = trace.SourceProc // /proc/<pid>/status: VmRSS is a gauge no probe improves on
		} else if name == trace.CollectorPressure {
			st.Programs = nil
			st.Source = trace.SourceProc
			if _, err := os.Stat(filepath.Join(opts.ProcRoot, "pressure")); err != nil {
				st.Source = trace.SourceOff
				st.Error = "no /proc/pressure (kernel without PSI)"
			}
		} else if loadErr != nil {
			st.Source = fallbacks[name]
			st.Error = loadErr.Error()
		} else {
			for _, p := range st.Programs {
				if err := failed[p]; err != nil {
					st.Source = fallbacks[name]
					st.Error = fmt.Sprintf("attach %s: %v", p, err)
					break
				}
			}
		}
		if st.Error != "" {
			log.Warn("collector not on bpf",
				zap.String("collector", name), zap.String("source", st.Source), zap.String("reason", st.Error))
		}
		c.status[name] = st
	}
	if c.probes != nil {
		for _, id := range cgroupIDs {
			if err := c.probes.watchCgroup(id); err != nil {
				c.Close()
				return nil, fmt.Errorf("watch cgroup: %w", err)
			}
		}
	}
	pids := slices.Clone(opts.PIDs)
	if opts.WatchSelf {
		pids = append(pids, os.Getpid())
	}
	for _, pid := range pids {
		if err := c.Watch(pid); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.last = time.Now()
	if c.probes != nil {
		c.prev, _ = c.probes.read(true)
		for _, p := range c.prev.progs {
			c.prevStats[p.Program] = p
		}
	}
	c.prevDisk = c.readDiskstats()
	return c, nil
}

// cgroupID is the cgroup v2 id of a cgroup directory: its kernfs inode number.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	const cgroup2Magic = 0x63677270
	if uint32(fs.Type) != cgroup2Magic {
		return 0, fmt.Errorf("cgroup %s: not a cgroup v2 directory", path)
	}
	return st.Ino, nil
}

// Watch adds a thread group to the in-kernel filter of the per-process collectors (the
// client of a live session, say). Watching an already watched pid is a no-op.
func (c *Collector) Watch(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("watch %d: %w", pid, ErrBadPID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if !pidAlive(c.opts.ProcRoot, pid) {
		return fmt.Errorf("watch %d: %w", pid, os.ErrNotExist)
	}
	if c.watched[pid] {
		return nil
	}
	if c.probes != nil {
		if err := c.probes.watch(uint32(pid)); err != nil {
			return fmt.Errorf("watch %d: %w", pid, err)
		}
	}
	c.watched[pid] = true
	// numa_maps costs tens of ms for a torch process (a page-table walk over ~1000
	// mappings): the first reading waits one interval, so short sessions pay none.
	c.numaRead[pid] = time.Now()
	// Baselines, so the first interval counts from now. The context switches are counted
	// from /proc only when sched is not on bpf (Snapshot reads prevCtx only then): the
	// sum over every thread's status file of a torch client cost ≈ 0.25 ms of CPU at
	// each session's OPEN (issue 38).
	if f, err := readProcFaults(c.procFS, pid); err == nil {
		c.prevProc[pid] = f
	}
	if c.status[trace.CollectorSched].Source != trace.SourceBPF {
		if v, i, err := ctxSwitches(c.procFS, pid); err == nil {
			c.prevCtx[pid] = [2]uint64{v, i}
		}
	}
	return nil
}

// Unwatch removes a thread group from the filter; its counts up to now still appear in
// the next Snapshot. Unwatching a pid that is not watched is a no-op.
func (c *Collector) Unwatch(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("unwatch %d: %w", pid, ErrBadPID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return c.unwatchLocked(pid)
}

func (c *Collector) unwatchLocked(pid int) error {
	if !c.watched[pid] {
		return nil
	}
	delete(c.watched, pid)
	delete(c.prevProc, pid)
	delete(c.prevCtx, pid)
	// numaRead stays: the pid's counts still appear in the next snapshot, and without
	// its time there it would read the numa_maps that the interval was skipping — at
	// every snapshot after each short session of a client that captures again and
	// again (pruneNUMARead drops the time once the interval is past).
	delete(c.totals, pid)
	c.io.forget(pid)
	if c.probes != nil {
		if err := c.probes.unwatch(uint32(pid)); err != nil {
			return fmt.Errorf("unwatch %d: %w", pid, err)
		}
		// sys_exit takes a call's number from its thread's pending entry, which is only
		// overwritten by a watched sys_enter: a stamp left by a call that returned while the
		// process was unwatched would be taken by some later call's exit after a new Watch.
		if tasks, err := os.ReadDir(filepath.Join(c.opts.ProcRoot, strconv.Itoa(pid), "task")); err == nil {
			for _, e := range tasks {
				if tid, err := strconv.Atoi(e.Name()); err == nil && tid > 0 {
					c.probes.forgetPending(uint32(tid))
				}
			}
		}
	}
	return nil
}

// SetSessions installs the callback that names the capture sessions live in each
// interval; Snapshot calls it without holding locks the callback could need. nil clears it.
func (c *Collector) SetSessions(f func() []trace.Session) {
	c.mu.Lock()
	c.sessions = f
	c.mu.Unlock()
}

// Status reports which collectors run from which source and the probes' cumulative run
// statistics.
func (c *Collector) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{Watched: c.watchedList(), Cgroups: slices.Clone(c.cgroups), BPFStats: []trace.ProgStats{}, Drops: map[string]uint64{}}
	for _, name := range collectorOrder {
		st.Collectors = append(st.Collectors, *c.status[name])
	}
	if c.probes != nil && !c.closed {
		raw, err := c.probes.read(false)
		if err == nil {
			for _, p := range raw.progs {
				p.Events, p.RunTimeNs = p.TotalEvents, p.TotalRunTimeNs
				p.NsPerEvent = nsPer(p.TotalRunTimeNs, p.TotalEvents)
				st.BPFStats = append(st.BPFStats, p)
			}
			for i, name := range dropNames {
				if raw.errs[i] != 0 {
					st.Drops[name] = raw.errs[i]
				}
			}
		}
		st.StatsError = c.probes.statsErr
	}
	return st
}

func (c *Collector) watchedList() []int {
	out := make([]int, 0, len(c.watched))
	for pid := range c.watched {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// Close detaches the probes and frees their maps. It is safe to call more than once.
func (c *Collector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.io.forget(-1)
	if c.probes != nil {
		return c.probes.close()
	}
	return nil
}

func nsPer(ns, n uint64) float64 {
	if n == 0 {
		return 0
	}
	return float64(ns) / float64(n)
}

func sub(a, b uint64) uint64 {
	if a < b {
		return a // counter restarted (entry deleted and recreated)
	}
	return a - b
}

func pidKey(pid int) string { return strconv.Itoa(pid) }

// ProcessTotals are one process's cumulative counters since its first watched event, read
// on demand (per token, not per interval): differences of two readings are what the
// process did in between.
type ProcessTotals struct {
	// OffCPU is the sum over the process's threads; BlockedNs is left 0.
	OffCPU trace.OffCPU
	// PageFaults counts user page faults.
	PageFaults uint64
	// SyscallCount counts returned syscalls; SyscallNs is the entry→exit time of the
	// SyscallTimed of them that were timed (read/write may be sampled).
	SyscallCount, SyscallTimed, SyscallNs uint64
	// ReadBytes and WriteBytes are /proc/<pid>/io read_bytes and write_bytes: storage
	// bytes the process caused to be read (at submission, readahead included) and to be
	// written (when it dirtied page-cache pages, not when writeback reached the disk).
	ReadBytes, WriteBytes uint64
}

// TrackTotals has the probes keep watched pid's cumulative totals in the kernel, so that
// ProcessTotals is one map lookup instead of a read of the thread and syscall tables: for a
// process whose totals are read often (at every TOKEN of a traced session). It costs the
// process one more map lookup per syscall and per switch-in, and lasts until Unwatch;
// totals count from the call on, so take the baseline reading after it.
func (c *Collector) TrackTotals(pid int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if !c.watched[pid] {
		return fmt.Errorf("track totals of %d: not watched", pid)
	}
	if c.probes == nil || c.status[trace.CollectorOffCPU].Source != trace.SourceBPF {
		return ErrUnsupported
	}
	if c.totals[pid] {
		return nil
	}
	if err := c.probes.watchTotals(uint32(pid)); err != nil {
		return fmt.Errorf("track totals of %d: %w", pid, err)
	}
	c.totals[pid] = true
	return nil
}

// ProcessTotals reads pid's cumulative counters. It needs the kernel probes (ErrUnsupported
// without them); pid must be watched for the probe counters to grow.
func (c *Collector) ProcessTotals(pid int) (ProcessTotals, error) {
	if pid <= 0 {
		return ProcessTotals{}, ErrBadPID
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ProcessTotals{}, ErrClosed
	}
	if c.probes == nil || c.status[trace.CollectorOffCPU].Source != trace.SourceBPF {
		return ProcessTotals{}, ErrUnsupported
	}
	read := c.probes.procTotals
	if c.totals[pid] {
		read = c.probes.procTotalsKernel
	}
	t, err := read(uint32(pid))
	if err != nil {
		return t, err
	}
	t.ReadBytes, t.WriteBytes, err = c.io.read(pid)
	return t, err
}
