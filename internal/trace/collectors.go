package trace

// Collector names, as used in bpf's Status and in a snapshot's "collectors" field.
const (
	// CollectorBlockIO is system-wide block I/O latency, IOPS, bytes and in-flight.
	CollectorBlockIO = "block_io"
	// CollectorOffCPU is off-CPU time per watched process, split by reason.
	CollectorOffCPU = "off_cpu"
	// CollectorPageFaults is user page faults per watched process.
	CollectorPageFaults = "page_faults"
	// CollectorSyscalls is mmap/mlock/munlock/openat per watched process.
	CollectorSyscalls = "syscalls"
	// CollectorSched is context switches and migrations per watched process.
	CollectorSched = "sched"
	// CollectorPressure is /proc/pressure (PSI).
	CollectorPressure = "pressure"
	// CollectorSyscallLatency is every syscall's count, errors and latency per watched
	// process.
	CollectorSyscallLatency = "syscall_latency"
	// CollectorSyncWait is futex/epoll/poll/ppoll/clock_nanosleep wait latency per watched
	// process.
	CollectorSyncWait = "sync_wait"
	// CollectorRunqueue is run-queue latency (runnable until on a CPU) per watched process.
	CollectorRunqueue = "runqueue"
	// CollectorNvidiaIoctl is ioctl latency on nvidia-named files per watched process.
	CollectorNvidiaIoctl = "nvidia_ioctl"
	// CollectorTCP is TCP bytes and retransmits per watched process.
	CollectorTCP = "tcp"
	// CollectorMemory is the resident set size per watched process (/proc).
	CollectorMemory = "memory"
)

// Sources of a collector's numbers.
const (
	// SourceBPF: counted by the kernel probes.
	SourceBPF = "bpf"
	// SourceProc: read from /proc (the fallback, or PSI).
	SourceProc = "proc"
	// SourceOff: not collected; bpf.CollectorStatus.Error says why.
	SourceOff = "off"
)
