package trace

import "time"

// Snapshot is one interval of kernel behaviour: one JSON line of a trace file. Field
// names of the original llm_instrumentation trace (timestamp, iso_timestamp, interval_s,
// latency_histogram, inflight, off_cpu_ns, page_faults, pressure) are kept; the rest are
// new and documented in docs/TRACE_FORMAT.md. Per-process maps are keyed by the decimal
// tgid. Counters are deltas over the interval; inflight is a gauge at the snapshot time.
type Snapshot struct {
	// Timestamp is the end of the interval, Unix seconds.
	Timestamp float64 `json:"timestamp"`
	// ISOTimestamp is Timestamp in RFC 3339 UTC with microseconds.
	ISOTimestamp string `json:"iso_timestamp"`
	// IntervalS is the length of the interval in seconds (monotonic clock).
	IntervalS float64 `json:"interval_s"`
	// Sessions are the capture sessions live during the interval (never null).
	Sessions []Session `json:"sessions"`
	// Watched lists the tgids the per-process collectors counted, sorted.
	Watched []int `json:"watched"`

	// LatencyHistogram is the block-request issue→complete latency (µs) per device.
	LatencyHistogram []DeviceHistogram `json:"latency_histogram"`
	// Inflight is the number of requests issued and not completed per device.
	Inflight []DeviceCount `json:"inflight"`
	// BlockIO is IOPS and bytes per device split by direction.
	BlockIO []DeviceIO `json:"block_io"`

	// OffCPUNs is the total off-CPU time per process (runnable + sleep + io).
	OffCPUNs map[string]uint64 `json:"off_cpu_ns"`
	// OffCPU splits OffCPUNs by reason.
	OffCPU map[string]OffCPU `json:"off_cpu"`
	// PageFaults is the user page faults per process in the interval.
	PageFaults map[string]uint64 `json:"page_faults"`
	// PageFaultsDetail gives the /proc major/minor split and the source of PageFaults.
	PageFaultsDetail map[string]PageFaults `json:"page_faults_detail"`
	// Syscalls counts the model-loading syscalls per process.
	Syscalls map[string]Syscalls `json:"syscalls"`
	// DeviceOpens lists every successful or failed open of a file whose name starts with
	// "nvidia" by a watched process in the interval.
	DeviceOpens []DeviceOpen `json:"device_opens"`
	// Sched is context switches and CPU migrations per process.
	Sched map[string]Sched `json:"sched"`
	// Threads is the per-thread breakdown, present only when asked for.
	Threads []Thread `json:"threads,omitempty"`

	// SyscallLatency is every syscall of each process by name: counts, errors and a
	// latency histogram (read and write possibly sampled: see LatencyStats.Timed).
	SyscallLatency map[string]map[string]LatencyStats `json:"syscall_latency"`
	// SyncWait is the blocking waits of each process by kind (futex, epoll_wait, poll,
	// ppoll, clock_nanosleep).
	SyncWait map[string]map[string]LatencyStats `json:"sync_wait"`
	// RunqueueLatency is how long each process's threads waited for a CPU once runnable.
	RunqueueLatency map[string]LatencyStats `json:"runqueue_latency"`
	// NvidiaIoctl is the ioctls on files whose name starts with "nvidia", per process.
	NvidiaIoctl map[string]LatencyStats `json:"nvidia_ioctl"`
	// TCP is bytes sent and received over TCP and retransmits, per process.
	TCP map[string]TCP `json:"tcp"`
	// Memory is each process's resident set size at the snapshot time (a gauge).
	Memory map[string]Memory `json:"memory"`

	// Pressure is /proc/pressure cpu/io/memory; absent where the kernel has no PSI.
	Pressure map[string]PSIResource `json:"pressure,omitempty"`

	// Collectors names the source of each collector: "bpf", "proc" (fallback) or "off".
	Collectors map[string]string `json:"collectors"`
	// BPFStats is each attached program's run statistics over the interval.
	BPFStats []ProgStats `json:"bpf_stats"`
	// Drops counts events the probes could not record in the interval, by reason; a
	// non-zero value means the numbers above are undercounts.
	Drops map[string]uint64 `json:"drops"`

	// TokensKernel is the kernel activity per generated token of the session whose trace
	// this line is written to (set by the capture server, never by the collector); absent when
	// the session recorded no token in the interval.
	TokensKernel []TokenKernel `json:"tokens_kernel,omitempty"`

	// ModelLoad is the model-load phase of the client of the session whose trace this
	// line is written to, when its first PUBLISH arrived in the interval (set by the
	// capture server, never by the collector).
	ModelLoad []ModelLoad `json:"model_load,omitempty"`

	// NUMA is each process's cross-node CPU migrations; absent on a one-node machine.
	NUMA map[string]NUMA `json:"numa,omitempty"`

	// NUMAPages is each process's resident pages per NUMA node (keyed by decimal node
	// number) from /proc/<pid>/numa_maps, a gauge read at most every
	// bpf.Options.NUMAMapsInterval: a process appears only in the snapshots that read it.
	NUMAPages map[string]map[string]NodePages `json:"numa_pages,omitempty"`

	// ThreadCPU is each process's on-CPU time by thread name; absent when no watched
	// process's threads could be read.
	ThreadCPU map[string]map[string]ThreadCPU `json:"thread_cpu,omitempty"`

	// Spans are the application's correlation spans overlapping the interval (strapd
	// trace --spans); absent without a spans file.
	Spans []Span `json:"spans,omitempty"`
}

// TokenKernel is what the kernel did for a session's client process while it generated one
// token: the window from strapd's receipt of the previous TOKEN (or of OPEN, for the
// first) to its receipt of this one.
type TokenKernel struct {
	// Session is the capture session id; Index and TokenID are the TOKEN's.
	Session string `json:"session"`
	Index   uint64 `json:"index"`
	TokenID int64  `json:"token_id"`
	// PID is the client's tgid.
	PID int `json:"pid"`
	// Timestamp is when strapd received the TOKEN (Unix seconds); WindowS the window's
	// length in seconds (monotonic clock).
	Timestamp float64 `json:"timestamp"`
	WindowS   float64 `json:"window_s"`
	// OffCPUNs is OffCPU's runnable + sleep + io, summed over the process's threads.
	OffCPUNs uint64 `json:"off_cpu_ns"`
	OffCPU   OffCPU `json:"off_cpu"`
	// PageFaults counts user page faults.
	PageFaults uint64 `json:"page_faults"`
	// SyscallCount counts returned syscalls; SyscallNs is the time of the SyscallTimed of
	// them that were timed.
	SyscallCount uint64 `json:"syscall_count"`
	SyscallTimed uint64 `json:"syscall_timed"`
	SyscallNs    uint64 `json:"syscall_ns"`
	// BlockReadBytes and BlockWriteBytes are the task I/O accounting's storage bytes
	// (/proc/<pid>/io read_bytes, write_bytes).
	BlockReadBytes  uint64 `json:"block_read_bytes"`
	BlockWriteBytes uint64 `json:"block_write_bytes"`
}

// Session names one live capture session; supplied to the collector through bpf.Collector.SetSessions.
type Session struct {
	// ID is the session id of the capture protocol.
	ID string `json:"id"`
	// Output is the capture's stream file path (or "fd:N" when passed by descriptor).
	Output string `json:"output,omitempty"`
	// PID is the client's tgid.
	PID int `json:"pid,omitempty"`
}

// DeviceHistogram is one device's latency histogram over the interval.
type DeviceHistogram struct {
	// DeviceName is the kernel name (vda, nvme0n1), or "M:m" when sysfs has none.
	DeviceName string `json:"device_name"`
	// Device is "major:minor" of the whole disk.
	Device string `json:"device"`
	// Total is the number of completed requests (the sum of the bucket counts).
	Total uint64 `json:"total"`
	// Buckets are the non-empty log2 buckets in slot order.
	Buckets []Bucket `json:"buckets"`
}

// Bucket is one log2 latency bucket: requests whose latency in µs lies in
// [BucketLow, BucketHigh]; slot s covers [(1<<s)>>1, (1<<s)-1].
type Bucket struct {
	// Slot is the bit length of the latency in µs.
	Slot int `json:"slot"`
	// Count is the number of requests.
	Count uint64 `json:"count"`
	// BucketLow is the smallest latency (µs) in the bucket.
	BucketLow uint64 `json:"bucket_low"`
	// BucketHigh is the largest latency (µs) in the bucket.
	BucketHigh uint64 `json:"bucket_high"`
}

// DeviceCount is a per-device gauge.
type DeviceCount struct {
	// DeviceName is as in DeviceHistogram.
	DeviceName string `json:"device_name"`
	// Count is the gauge value.
	Count int64 `json:"count"`
}

// DeviceIO is one device's completed requests and bytes over the interval.
type DeviceIO struct {
	// DeviceName is as in DeviceHistogram.
	DeviceName string `json:"device_name"`
	// ReadIOs, WriteIOs and OtherIOs (flush, discard…) count completed requests.
	// The /proc/diskstats fallback has no OtherIOs/OtherBytes.
	ReadIOs  uint64 `json:"read_ios"`
	WriteIOs uint64 `json:"write_ios"`
	OtherIOs uint64 `json:"other_ios"`
	// ReadBytes, WriteBytes and OtherBytes sum the request sizes at issue.
	ReadBytes  uint64 `json:"read_bytes"`
	WriteBytes uint64 `json:"write_bytes"`
	OtherBytes uint64 `json:"other_bytes"`
	// ReadIOPS and WriteIOPS are the counts divided by the interval.
	ReadIOPS  float64 `json:"read_iops"`
	WriteIOPS float64 `json:"write_iops"`
}

// OffCPU splits off-CPU time by reason, so it is never ambiguous.
type OffCPU struct {
	// RunnableNs: preempted (or woken) and waiting for a CPU.
	RunnableNs uint64 `json:"runnable_ns"`
	// SleepNs: interruptible sleep until the wakeup (nanosleep, futex, poll, read).
	SleepNs uint64 `json:"sleep_ns"`
	// IONs: uninterruptible sleep until the wakeup (disk I/O, page-cache misses).
	IONs uint64 `json:"io_ns"`
	// BlockedNs is SleepNs + IONs.
	BlockedNs uint64 `json:"blocked_ns"`
}

// PageFaults is one process's page faults over the interval.
type PageFaults struct {
	// User is the count of the exceptions:page_fault_user probe (0 when Source is proc).
	User uint64 `json:"user"`
	// Minor and Major are the deltas of /proc/<pid>/stat minflt and majflt.
	Minor uint64 `json:"minor"`
	Major uint64 `json:"major"`
	// Source is "bpf" or "proc" (page_faults is then minor+major).
	Source string `json:"source"`
}

// Syscalls counts one process's model-loading syscalls in the interval.
type Syscalls struct {
	// MmapCount and MmapBytes: successful mmap calls and their length arguments.
	MmapCount uint64 `json:"mmap_count"`
	MmapBytes uint64 `json:"mmap_bytes"`
	// MlockCount and MlockBytes: successful mlock and mlock2 calls and their lengths.
	MlockCount uint64 `json:"mlock_count"`
	MlockBytes uint64 `json:"mlock_bytes"`
	// MunlockCount and MunlockBytes: successful munlock calls and their lengths.
	MunlockCount uint64 `json:"munlock_count"`
	MunlockBytes uint64 `json:"munlock_bytes"`
	// OpenatCount is every openat call; OpenatFailed those that returned an error.
	OpenatCount  uint64 `json:"openat_count"`
	OpenatFailed uint64 `json:"openat_failed"`
	// NvidiaOpens is the openat calls of nvidia-named paths (listed in DeviceOpens).
	NvidiaOpens uint64 `json:"nvidia_opens"`
}

// DeviceOpen is one openat of an nvidia-named path.
type DeviceOpen struct {
	// PID (tgid) and TID of the caller.
	PID int `json:"pid"`
	TID int `json:"tid"`
	// Path is the path argument as passed (relative paths stay relative).
	Path string `json:"path"`
	// Ret is the syscall result: the fd, or -errno.
	Ret int64 `json:"ret"`
}

// Sched is context switches and migrations over the interval.
type Sched struct {
	// Voluntary switches: the thread blocked. Involuntary: it was preempted.
	Voluntary   uint64 `json:"voluntary"`
	Involuntary uint64 `json:"involuntary"`
	// Migrations is CPU migrations (bpf only).
	Migrations uint64 `json:"migrations"`
	// Source is "bpf" or "proc".
	Source string `json:"source"`
}

// Thread is one watched thread's off-CPU and scheduler numbers over the interval.
type Thread struct {
	// TID is the thread id, PID its thread group.
	TID int `json:"tid"`
	PID int `json:"pid"`
	// OffCPU is the thread's off-CPU split (fields inlined in JSON).
	OffCPU
	// Voluntary, Involuntary and Migrations are as in Sched.
	Voluntary   uint64 `json:"voluntary"`
	Involuntary uint64 `json:"involuntary"`
	Migrations  uint64 `json:"migrations"`
}

// LatencyStats is a count of events with a log2 latency histogram over the interval.
type LatencyStats struct {
	// Count is every event; Errors those that returned an error (-errno).
	Count  uint64 `json:"count"`
	Errors uint64 `json:"errors"`
	// Timed is how many of Count were timed into TotalNs and Buckets: all of them except
	// for sampled read/write (--sample-read-write N times about one in N) and calls
	// already in progress when the probe attached.
	Timed   uint64 `json:"timed"`
	TotalNs uint64 `json:"total_ns"`
	// Buckets are the non-empty log2 buckets of latency in µs, as in DeviceHistogram.
	Buckets []Bucket `json:"buckets"`
}

// TCP is one process's TCP traffic over the interval.
type TCP struct {
	// TxBytes and RxBytes are what send/write and recv/read calls on TCP sockets
	// moved; TxCalls and RxCalls count those calls.
	TxBytes uint64 `json:"tx_bytes"`
	RxBytes uint64 `json:"rx_bytes"`
	TxCalls uint64 `json:"tx_calls"`
	RxCalls uint64 `json:"rx_calls"`
	// Retransmits counts segment retransmissions on sockets this process moved data on.
	Retransmits uint64 `json:"retransmits"`
}

// Memory is one process's memory at the snapshot time.
type Memory struct {
	// RSSBytes is VmRSS and RSSPeakBytes VmHWM of /proc/<pid>/status.
	RSSBytes     uint64 `json:"rss_bytes"`
	RSSPeakBytes uint64 `json:"rss_peak_bytes"`
}

// ProgStats is one BPF program's run statistics (kernel.bpf_stats_enabled).
type ProgStats struct {
	// Program is the BPF program name.
	Program string `json:"program"`
	// Events is the number of runs in the interval; RunTimeNs their total time.
	Events    uint64 `json:"events"`
	RunTimeNs uint64 `json:"run_time_ns"`
	// NsPerEvent is RunTimeNs/Events (0 with no events).
	NsPerEvent float64 `json:"ns_per_event"`
	// TotalEvents and TotalRunTimeNs are cumulative since the program was loaded.
	TotalEvents    uint64 `json:"total_events"`
	TotalRunTimeNs uint64 `json:"total_run_time_ns"`
	// RecursionMisses counts runs skipped because another program ran on the CPU.
	RecursionMisses uint64 `json:"recursion_misses"`
}

// NewSnapshot returns a Snapshot whose lists and maps are empty rather than nil, so every
// line has [] / {} where there is nothing to report (TRACE_FORMAT.md: never null).
func NewSnapshot() Snapshot {
	return Snapshot{
		Sessions: []Session{}, Watched: []int{}, LatencyHistogram: []DeviceHistogram{}, Inflight: []DeviceCount{},
		BlockIO: []DeviceIO{}, OffCPUNs: map[string]uint64{}, OffCPU: map[string]OffCPU{}, PageFaults: map[string]uint64{},
		PageFaultsDetail: map[string]PageFaults{}, Syscalls: map[string]Syscalls{}, DeviceOpens: []DeviceOpen{},
		Sched: map[string]Sched{}, Collectors: map[string]string{}, BPFStats: []ProgStats{}, Drops: map[string]uint64{},
		SyscallLatency: map[string]map[string]LatencyStats{}, SyncWait: map[string]map[string]LatencyStats{},
		RunqueueLatency: map[string]LatencyStats{}, NvidiaIoctl: map[string]LatencyStats{}, TCP: map[string]TCP{},
		Memory: map[string]Memory{},
	}
}

// Stamp fills the time fields of s for the interval ending at end.
func (s *Snapshot) Stamp(end time.Time, interval time.Duration) {
	s.Timestamp = float64(end.UnixNano()) / 1e9
	s.ISOTimestamp = end.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	s.IntervalS = interval.Seconds()
}

// StatsMissing reports whether the snapshot has no BPF run statistics although probes
// ran (kernel.bpf_stats_enabled could not be turned on).
func (s *Snapshot) StatsMissing() bool {
	for _, p := range s.BPFStats {
		if p.TotalEvents > 0 && p.TotalRunTimeNs > 0 {
			return false
		}
	}
	return true
}

// PSIValues is one line of /proc/pressure/<resource>: the share of wall time (percent)
// that some (or all, for "full") non-idle tasks were stalled on the resource, averaged
// over 10 s, 60 s and 300 s, and the cumulative stall time in microseconds.
type PSIValues struct {
	Avg10  float64 `json:"avg10"`
	Avg60  float64 `json:"avg60"`
	Avg300 float64 `json:"avg300"`
	Total  uint64  `json:"total"`
}

// PSIResource holds the "some" and "full" lines of one resource; Full is nil where the
// kernel prints no full line (cpu before 5.13).
type PSIResource struct {
	Some *PSIValues `json:"some,omitempty"`
	Full *PSIValues `json:"full,omitempty"`
}

// PSIResources are the files read under /proc/pressure, in output order.
var PSIResources = []string{"cpu", "io", "memory"}

// ModelLoad is one model-load phase of a capture session's client: from the client's
// first open of a model weight file (a name ending in .safetensors, .gguf, .bin, .pt or
// .pth) to strapd's receipt of the session's first PUBLISH, the first forward pass the
// client reports.
type ModelLoad struct {
	// Session is the capture session id; PID the client's tgid.
	Session string `json:"session"`
	PID     int    `json:"pid"`
	// Path is the weight file as passed to openat (relative paths stay relative).
	Path string `json:"path"`
	// Start is the open and End the receipt of the first PUBLISH, Unix seconds; DurationS
	// is End - Start, measured on the boot-time clock (suspend included, no wall-clock
	// steps).
	Start     float64 `json:"start"`
	End       float64 `json:"end"`
	DurationS float64 `json:"duration_s"`
}

// NUMA is a process's NUMA behaviour over the interval.
type NUMA struct {
	// CrossNodeMigrations counts CPU migrations of its threads whose source and
	// destination CPUs are on different nodes (a thread leaving its memory's node).
	CrossNodeMigrations uint64 `json:"cross_node_migrations"`
}

// NodePages is what one process has resident on one NUMA node.
type NodePages struct {
	// Pages counts the pages as the kernel does: a huge page is one page.
	Pages uint64 `json:"pages"`
	// Bytes is Pages times each mapping's page size.
	Bytes uint64 `json:"bytes"`
}

// ThreadCPU is the CPU time of one process's threads that share a name (torch's
// intra-op pool, a tokenizer worker, the main thread) over the interval.
type ThreadCPU struct {
	// Threads is how many threads had the name at the snapshot.
	Threads int `json:"threads"`
	// CPUNs is their on-CPU time in the interval (schedstat run time deltas).
	CPUNs uint64 `json:"cpu_ns"`
}
