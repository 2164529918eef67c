//go:build ignore

// STRAP-LLM kernel probes: block I/O latency (system-wide), and for watched processes
// off-CPU time split by reason, context switches, migrations, run-queue latency, user
// page faults, the model-loading syscalls (mmap, mlock, mlock2, munlock, openat), every
// syscall's count, errors and latency, the sync waits (futex, epoll, poll, ppoll,
// clock_nanosleep), ioctls on nvidia-named files and TCP bytes and retransmits; and, for
// every process, its first open of a model weight file (the start of a model load).
//
// Every program is a raw tracepoint (raw_tp): no tracefs is needed, the cost per event is
// close to tp_btf, and unlike tp_btf the kernel lets raw_tp programs run under
// BPF_PROG_TEST_RUN, so the logic below is unit-tested from Go with fake arguments.
// Kernel pointers are read through BPF_CORE_READ (probe_read_kernel with CO-RE
// relocations), so the object loads on any BTF kernel whose structs moved.

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "arch.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define MAX_SLOTS 32
#define PATH_MAX_LEN 256

// Request operation classes (REQ_OP_READ = 0, REQ_OP_WRITE = 1; flush, discard... = other).
#define OP_READ 0
#define OP_WRITE 1
#define OP_OTHER 2
#define REQ_OP_MASK_ ((1 << 8) - 1)

// Task states as the scheduler passes them to sched_switch.
#define TASK_RUNNING_ 0x0
#define TASK_INTERRUPTIBLE_ 0x1
#define TASK_UNINTERRUPTIBLE_ 0x2

// Why a watched thread is off-CPU; stored with the switch-out stamp.
#define OFF_RUNNABLE 0 // preempted or yielded: runnable, waiting for a CPU
#define OFF_SLEEP 1    // interruptible sleep (S): nanosleep, futex, poll, pipe read
#define OFF_IO 2       // uninterruptible (D): disk I/O, page-cache misses, some locks
#define OFF_NONE 3     // no stamp: the thread is on a CPU (the entry is kept, see sched_switch)

// Counter indices in the errs map: events the probes had to drop.
#define ERR_RQ_MAP_FULL 0
#define ERR_THREAD_MAP_FULL 1
#define ERR_PROC_MAP_FULL 2
#define ERR_DEV_MAP_FULL 3
#define ERR_RINGBUF_FULL 4
#define ERR_PENDING_MAP_FULL 5
#define ERR_SYSCALL_MAP_FULL 6
#define ERR_STATS_MAP_FULL 7 // sync_stats, runq_stats, ioctl_stats, tcp_stats_map
#define ERR_MAX 8

// Sync-wait kinds (the key's second half in sync_stats).
#define SYNC_FUTEX 0 // futex wait operations and futex_waitv
#define SYNC_EPOLL 1 // epoll_wait, epoll_pwait, epoll_pwait2
#define SYNC_POLL 2
#define SYNC_PPOLL 3
#define SYNC_NANOSLEEP 4 // clock_nanosleep
#define SYNC_NONE 0xff

// pending_syscall.flags
#define PF_TIMED 1  // stamped at entry: its latency is recorded at exit
#define PF_NVIDIA 2 // an ioctl on a file whose name starts with "nvidia"

#define IPPROTO_TCP_ 6

// Syscall numbers: x86_64 defaults; the loader sets every nr_* for its architecture
// (-1 for a call the architecture lacks, such as poll and epoll_wait on arm64).
volatile const __s64 nr_mmap = 9;
volatile const __s64 nr_mlock = 149;
volatile const __s64 nr_munlock = 150;
volatile const __s64 nr_mlock2 = 325;
volatile const __s64 nr_openat = 257;
volatile const __s64 nr_read = 0;
volatile const __s64 nr_write = 1;
volatile const __s64 nr_ioctl = 16;
volatile const __s64 nr_futex = 202;
volatile const __s64 nr_futex_waitv = 449;
volatile const __s64 nr_epoll_wait = 232;
volatile const __s64 nr_epoll_pwait = 281;
volatile const __s64 nr_epoll_pwait2 = 441;
volatile const __s64 nr_poll = 7;
volatile const __s64 nr_ppoll = 271;
volatile const __s64 nr_clock_nanosleep = 230;

// Time one read/write in sample_rw (1 = every one); counts and errors are always exact.
volatile const __u32 sample_rw = 1;

struct rq_start {
	__u64 ts;
	__u64 bytes;
	__u32 dev;
	__u32 op;
};

struct dev_stats {
	__u64 ios[3];
	__u64 bytes[3];
	__u64 slots[MAX_SLOTS];
};

struct offcpu_start {
	__u64 ts;
	__u32 reason;
	__u32 tgid;
	__u32 totals; // the process keeps per-process totals (WATCH_TOTALS at switch-out)
	__u32 _pad;
};

struct thread_stats {
	__u32 tgid;
	__u32 _pad;
	__u64 runnable_ns;
	__u64 sleep_ns;
	__u64 io_ns;
	__u64 nvcsw;
	__u64 nivcsw;
	__u64 migrations;
	__u64 cross_node; // migrations whose source and destination CPUs are on different NUMA nodes
};

struct proc_stats {
	__u64 page_faults;
	__u64 mmap_count;
	__u64 mmap_bytes;
	__u64 mlock_count;
	__u64 mlock_bytes;
	__u64 munlock_count;
	__u64 munlock_bytes;
	__u64 openat_count;
	__u64 openat_failed;
	__u64 nvidia_opens;
	__u64 exited;       // 1 once the last thread exited; exit_* are then final
	__u64 exit_min_flt; // the process's lifetime minflt/majflt as /proc/<pid>/stat showed them
	__u64 exit_maj_flt;
	// Per-process totals, kept only for a WATCH_TOTALS process (a traced session's client,
	// read at every TOKEN with one lookup): off-CPU time by reason over all its threads,
	// returned syscalls, how many were timed and their time.
	__u64 tot_runnable_ns;
	__u64 tot_sleep_ns;
	__u64 tot_io_ns;
	__u64 tot_syscalls;
	__u64 tot_timed;
	__u64 tot_syscall_ns;
};

struct pending_syscall {
	__s64 nr;
	__u64 arg0;
	__u64 arg1;
	__u64 ts;
	__u32 flags;
	__u32 sync_kind;
};

// Key of per-process stats split by syscall number or sync-wait kind.
struct tgid_key {
	__u32 tgid;
	__u32 id;
};

// A latency histogram with its counts. count and errors cover every call; timed is how
// many of them went into total_ns and slots (fewer when read/write are sampled).
struct lat_stats {
	__u64 count;
	__u64 errors;
	__u64 timed;
	__u64 total_ns;
	__u64 slots[MAX_SLOTS];
};

struct tcp_stats {
	__u64 tx_bytes;
	__u64 rx_bytes;
	__u64 tx_calls;
	__u64 rx_calls;
	__u64 retransmits;
};

struct open_event {
	__u32 tgid;
	__u32 tid;
	__s64 ret;
	char path[PATH_MAX_LEN];
};

// Block requests in flight, keyed by the struct request pointer (not the sector: one
// sector can have several requests in flight, and a keyed-by-sector entry leaks when a
// request is merged). User space counts entries per device for the in-flight gauge.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct rq_start);
} rq_starts SEC(".maps");

// Cumulative per-device counters and latency histogram; user space diffs per interval.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct dev_stats);
} dev_stats_map SEC(".maps");

// Watched thread groups (tgid -> WATCH_* bits) and cgroup v2 ids (id -> 1).
#define WATCH_ON 1
#define WATCH_TOTALS 2 // also keep the per-process totals of proc_stats
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} watched_tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, __u8);
} watched_cgroups SEC(".maps");

// cpu_node[cpu]: the NUMA node of each CPU, filled from sysfs at load (all 0 when
// unknown, so no migration counts as cross-node).
#define MAX_CPUS 1024
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);
	__type(value, __u32);
} cpu_node SEC(".maps");

// Kernels before 5.16 keep the CPU in task_struct, later ones in thread_info.
struct task_struct___old {
	unsigned int cpu;
} __attribute__((preserve_access_index));

static __always_inline __u32 task_cpu_of(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return BPF_CORE_READ(p, thread_info.cpu);
	struct task_struct___old *o = (void *)p;
	return BPF_CORE_READ(o, cpu);
}

// cfg[0]: number of watched cgroups (0 skips the cgroup-id read on every event).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, struct offcpu_start);
} offcpu_starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, struct thread_stats);
} thread_stats_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct proc_stats);
} proc_stats_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, struct pending_syscall);
} pending_syscalls SEC(".maps");

// Every syscall of watched processes by (tgid, nr); sync waits by (tgid, SYNC_*).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct tgid_key);
	__type(value, struct lat_stats);
} syscall_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tgid_key);
	__type(value, struct lat_stats);
} sync_stats SEC(".maps");

// Run-queue latency and nvidia ioctls per tgid.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct lat_stats);
} runq_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct lat_stats);
} ioctl_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct tcp_stats);
} tcp_stats_map SEC(".maps");

// TCP socket -> the watched tgid that last sent or received on it: a retransmit runs
// from a timer or softirq, where current is not the owner. LRU, so closed sockets age out.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u32);
} sock_owner SEC(".maps");

// Counter for read/write sampling; per CPU, so no atomics on the hot path.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} rw_seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ERR_MAX);
	__type(key, __u32);
	__type(value, __u64);
} errs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} open_events SEC(".maps");

// The first openat of a model weight file by a process: when it started loading a model.
// Recorded for every process, not only watched ones: a capture session's client is
// watched from its OPEN, which comes after the model is loaded.
struct weight_open {
	__u64 ts;         // bpf_ktime_get_boot_ns() at the openat's entry
	__u64 start_boot; // the process's start (group leader's start_boottime): tells a reused pid
	char path[PATH_MAX_LEN];
};

// tgid -> its first weight-file open; LRU, so processes long gone age out. User space
// deletes an entry once it has reported the load, so a later load is seen again.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct weight_open);
} weight_opens SEC(".maps");

// Room for the path being checked (too large for the BPF stack beside the rest).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct weight_open);
} weight_scratch SEC(".maps");

// Force the event struct into BTF so bpf2go emits a Go type for it.
const struct open_event *unused_open_event __attribute__((unused));

static __always_inline void count_err(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&errs, &idx);
	if (v)
		__sync_fetch_and_add(v, 1);
}

// log2 slot of a value, bcc style: slot = bit length (0 for 0), so slot s holds
// [(1<<s)>>1, (1<<s)-1].
static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 slot = 0;
	if (v >= (1ULL << 32)) {
		v >>= 32;
		slot += 32;
	}
	if (v >= (1ULL << 16)) {
		v >>= 16;
		slot += 16;
	}
	if (v >= (1ULL << 8)) {
		v >>= 8;
		slot += 8;
	}
	if (v >= (1ULL << 4)) {
		v >>= 4;
		slot += 4;
	}
	if (v >= (1ULL << 2)) {
		v >>= 2;
		slot += 2;
	}
	if (v >= (1ULL << 1)) {
		v >>= 1;
		slot += 1;
	}
	if (v)
		slot += 1;
	return slot;
}

// cgroups_watched reports whether any cgroup is watched: without one, the cgroup id is
// never read (a helper call on every event of every unwatched process).
static __always_inline bool cgroups_watched(void)
{
	__u32 zero = 0;
	__u32 *n = bpf_map_lookup_elem(&cfg, &zero);
	return n && *n != 0;
}

static __always_inline bool tgid_watched(__u32 tgid)
{
	return bpf_map_lookup_elem(&watched_tgids, &tgid) != NULL;
}

static __always_inline bool task_watched(struct task_struct *t, __u32 tgid)
{
	if (tgid_watched(tgid))
		return true;
	if (!cgroups_watched())
		return false;
	__u64 cgid = BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
	return bpf_map_lookup_elem(&watched_cgroups, &cgid) != NULL;
}

// current_watch returns the current process's WATCH_* bits, 0 when it is not watched.
static __always_inline __u8 current_watch(__u32 tgid)
{
	__u8 *w = bpf_map_lookup_elem(&watched_tgids, &tgid);
	if (w)
		return *w;
	if (!cgroups_watched())
		return 0;
	__u64 cgid = bpf_get_current_cgroup_id();
	return bpf_map_lookup_elem(&watched_cgroups, &cgid) ? WATCH_ON : 0;
}

static __always_inline bool current_watched(__u32 tgid)
{
	if (tgid_watched(tgid))
		return true;
	if (!cgroups_watched())
		return false;
	__u64 cgid = bpf_get_current_cgroup_id();
	return bpf_map_lookup_elem(&watched_cgroups, &cgid) != NULL;
}

// lookup_or_init returns map's entry for key, creating it zeroed; NULL (counted under
// err_idx) when the map is full.
static __always_inline void *lookup_or_init(void *map, const void *key, const void *zero,
					    __u32 err_idx)
{
	void *v = bpf_map_lookup_elem(map, key);
	if (v)
		return v;
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	v = bpf_map_lookup_elem(map, key);
	if (!v)
		count_err(err_idx);
	return v;
}

static __always_inline void lat_add(struct lat_stats *l, bool timed, __u64 ns, bool err)
{
	__sync_fetch_and_add(&l->count, 1);
	if (err)
		__sync_fetch_and_add(&l->errors, 1);
	if (!timed)
		return;
	__u32 slot = log2_slot(ns / 1000);
	if (slot >= MAX_SLOTS)
		slot = MAX_SLOTS - 1;
	__sync_fetch_and_add(&l->timed, 1);
	__sync_fetch_and_add(&l->total_ns, ns);
	__sync_fetch_and_add(&l->slots[slot], 1);
}

// ---- block I/O -------------------------------------------------------------------------

SEC("raw_tp/block_rq_issue")
int BPF_PROG(block_rq_issue, struct request *rq)
{
	__u64 key = (__u64)rq;
	struct rq_start s = {};
	s.ts = bpf_ktime_get_ns();
	s.bytes = BPF_CORE_READ(rq, __data_len);
	__u32 flags = BPF_CORE_READ(rq, cmd_flags);
	__u32 op = flags & REQ_OP_MASK_;
	s.op = op == 0 ? OP_READ : (op == 1 ? OP_WRITE : OP_OTHER);
	int major = BPF_CORE_READ(rq, q, disk, major);
	int minor = BPF_CORE_READ(rq, q, disk, first_minor);
	s.dev = ((__u32)major << 20) | (__u32)minor;
	// A re-issue of the same request (after a requeue we missed) just restamps it.
	if (bpf_map_update_elem(&rq_starts, &key, &s, BPF_ANY) != 0)
		count_err(ERR_RQ_MAP_FULL);
	return 0;
}

SEC("raw_tp/block_rq_requeue")
int BPF_PROG(block_rq_requeue, struct request *rq)
{
	__u64 key = (__u64)rq;
	bpf_map_delete_elem(&rq_starts, &key);
	return 0;
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(block_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	__u64 key = (__u64)rq;
	struct rq_start *s = bpf_map_lookup_elem(&rq_starts, &key);
	if (!s)
		return 0; // issued before we attached, or a later partial completion
	struct rq_start st = *s;
	// Only the deleter accounts, so a racing duplicate completion is counted once.
	if (bpf_map_delete_elem(&rq_starts, &key) != 0)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 us = now > st.ts ? (now - st.ts) / 1000 : 0;

	struct dev_stats *d = bpf_map_lookup_elem(&dev_stats_map, &st.dev);
	if (!d) {
		struct dev_stats zero = {};
		if (bpf_map_update_elem(&dev_stats_map, &st.dev, &zero, BPF_NOEXIST) != 0 &&
		    bpf_map_lookup_elem(&dev_stats_map, &st.dev) == NULL) {
			count_err(ERR_DEV_MAP_FULL);
			return 0;
		}
		d = bpf_map_lookup_elem(&dev_stats_map, &st.dev);
		if (!d)
			return 0;
	}
	__u32 slot = log2_slot(us);
	if (slot >= MAX_SLOTS)
		slot = MAX_SLOTS - 1;
	__u32 op = st.op;
	if (op > OP_OTHER)
		op = OP_OTHER;
	__sync_fetch_and_add(&d->slots[slot], 1);
	__sync_fetch_and_add(&d->ios[op], 1);
	__sync_fetch_and_add(&d->bytes[op], st.bytes);
	return 0;
}

// ---- scheduler: off-CPU, context switches, migrations -----------------------------------

static __always_inline struct thread_stats *thread_entry(__u32 tid, __u32 tgid)
{
	struct thread_stats *ts = bpf_map_lookup_elem(&thread_stats_map, &tid);
	if (ts)
		return ts;
	struct thread_stats zero = {.tgid = tgid};
	if (bpf_map_update_elem(&thread_stats_map, &tid, &zero, BPF_NOEXIST) != 0) {
		ts = bpf_map_lookup_elem(&thread_stats_map, &tid);
		if (!ts)
			count_err(ERR_THREAD_MAP_FULL);
		return ts;
	}
	return bpf_map_lookup_elem(&thread_stats_map, &tid);
}

static struct proc_stats zero_proc_stats;

static __always_inline struct proc_stats *proc_entry(__u32 tgid)
{
	struct proc_stats *ps = bpf_map_lookup_elem(&proc_stats_map, &tgid);
	if (ps)
		return ps;
	// A zero entry from .bss: sys_exit's stack cannot hold this one beside the others.
	if (bpf_map_update_elem(&proc_stats_map, &tgid, &zero_proc_stats, BPF_NOEXIST) != 0) {
		ps = bpf_map_lookup_elem(&proc_stats_map, &tgid);
		if (!ps)
			count_err(ERR_PROC_MAP_FULL);
		return ps;
	}
	return bpf_map_lookup_elem(&proc_stats_map, &tgid);
}

static __always_inline void account_offcpu(struct thread_stats *ts, const struct offcpu_start *s,
					   __u64 delta)
{
	__u32 reason = s->reason;
	if (ts) {
		if (reason == OFF_RUNNABLE)
			__sync_fetch_and_add(&ts->runnable_ns, delta);
		else if (reason == OFF_IO)
			__sync_fetch_and_add(&ts->io_ns, delta);
		else
			__sync_fetch_and_add(&ts->sleep_ns, delta);
	}
	if (!s->totals)
		return;
	struct proc_stats *ps = proc_entry(s->tgid);
	if (!ps)
		return;
	if (reason == OFF_RUNNABLE)
		__sync_fetch_and_add(&ps->tot_runnable_ns, delta);
	else if (reason == OFF_IO)
		__sync_fetch_and_add(&ps->tot_io_ns, delta);
	else
		__sync_fetch_and_add(&ps->tot_sleep_ns, delta);
}

// stamp_offcpu records tid's switch-out (or new-task) stamp. A thread's entry is written
// in place once it exists and is never deleted by the probes (a switch-in marks it
// OFF_NONE; user space drops the entries of exited threads): a hash update or delete
// takes the bucket lock and recycles an element, several times the cost of a lookup,
// on every context switch of a watched thread.
static __always_inline void stamp_offcpu(__u32 tid, __u64 ts, __u32 reason, __u32 tgid,
					 __u32 totals)
{
	struct offcpu_start *cur = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (cur) {
		cur->ts = ts;
		cur->tgid = tgid;
		cur->totals = totals;
		cur->reason = reason;
		return;
	}
	struct offcpu_start st = {.ts = ts, .reason = reason, .tgid = tgid, .totals = totals};
	bpf_map_update_elem(&offcpu_starts, &tid, &st, BPF_NOEXIST);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	// The tracepoint fires before the switch, while current is still prev: its ids come
	// from a helper instead of two reads of prev's task_struct, and the clock is read
	// only when a watched thread is involved.
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 prev_tid = (__u32)pid_tgid;
	__u32 prev_tgid = pid_tgid >> 32;
	__u64 now = 0;
	__u8 w = prev_tid != 0 ? current_watch(prev_tgid) : 0;
	if (w) {
		now = bpf_ktime_get_ns();
		__u32 reason;
		bool voluntary = !preempt && prev_state != TASK_RUNNING_;
		if (!voluntary)
			reason = OFF_RUNNABLE;
		else if (prev_state & TASK_UNINTERRUPTIBLE_)
			reason = OFF_IO;
		else
			reason = OFF_SLEEP;
		stamp_offcpu(prev_tid, now, reason, prev_tgid, w & WATCH_TOTALS);
		struct thread_stats *ts = thread_entry(prev_tid, prev_tgid);
		if (ts) {
			if (voluntary)
				__sync_fetch_and_add(&ts->nvcsw, 1);
			else
				__sync_fetch_and_add(&ts->nivcsw, 1);
		}
	}

	__u32 next_tid = BPF_CORE_READ(next, pid);
	struct offcpu_start *st = bpf_map_lookup_elem(&offcpu_starts, &next_tid);
	if (st && st->reason != OFF_NONE) {
		struct offcpu_start s = *st;
		st->reason = OFF_NONE;
		if (!now)
			now = bpf_ktime_get_ns();
		if (now > s.ts) {
			account_offcpu(thread_entry(next_tid, s.tgid), &s, now - s.ts);
			// Runnable since a wakeup or a preemption: that wait is run-queue latency.
			if (s.reason == OFF_RUNNABLE) {
				struct lat_stats zero = {};
				struct lat_stats *l = lookup_or_init(&runq_stats, &s.tgid, &zero,
								     ERR_STATS_MAP_FULL);
				if (l)
					lat_add(l, true, now - s.ts, false);
			}
		}
	}
	return 0;
}

// A wakeup ends the blocked part of an off-CPU period; the rest, until the thread is
// switched in, is time spent runnable waiting for a CPU.
static __always_inline int on_wakeup(struct task_struct *p)
{
	__u32 tid = BPF_CORE_READ(p, pid);
	struct offcpu_start *st = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (!st || (st->reason != OFF_SLEEP && st->reason != OFF_IO))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct offcpu_start s = *st;
	if (now > s.ts) {
		account_offcpu(thread_entry(tid, s.tgid), &s, now - s.ts);
	}
	st->ts = now;
	st->reason = OFF_RUNNABLE;
	return 0;
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	return on_wakeup(p);
}

// A new task is runnable from its first wakeup: stamp it so that its first switch-in
// counts as run-queue latency (it has no switch-out stamp yet).
SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new, struct task_struct *p)
{
	__u32 tid = BPF_CORE_READ(p, pid);
	__u32 tgid = BPF_CORE_READ(p, tgid);
	if (tid == 0 || !task_watched(p, tgid))
		return 0;
	__u8 *w = bpf_map_lookup_elem(&watched_tgids, &tgid);
	stamp_offcpu(tid, bpf_ktime_get_ns(), OFF_RUNNABLE, tgid, w && (*w & WATCH_TOTALS));
	return 0;
}

SEC("raw_tp/sched_migrate_task")
int BPF_PROG(sched_migrate_task, struct task_struct *p, int dest_cpu)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u32 tid = BPF_CORE_READ(p, pid);
	if (tid == 0 || !task_watched(p, tgid))
		return 0;
	struct thread_stats *ts = thread_entry(tid, tgid);
	if (!ts)
		return 0;
	__sync_fetch_and_add(&ts->migrations, 1);
	__u32 from = task_cpu_of(p), to = dest_cpu;
	__u32 *nf = bpf_map_lookup_elem(&cpu_node, &from);
	__u32 *nt = bpf_map_lookup_elem(&cpu_node, &to);
	if (nf && nt && *nf != *nt)
		__sync_fetch_and_add(&ts->cross_node, 1);
	return 0;
}

// ---- per-process: page faults and syscalls ------------------------------------------------

SEC("raw_tp/page_fault_user")
int BPF_PROG(page_fault_user, unsigned long address, struct pt_regs *regs, unsigned long error_code)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!current_watched(tgid))
		return 0;
	struct proc_stats *ps = proc_entry(tgid);
	if (ps)
		__sync_fetch_and_add(&ps->page_faults, 1);
	return 0;
}

// When the last thread of a watched process exits, keep its lifetime fault counters:
// /proc/<pid>/stat is gone by the time user space takes the next snapshot, and the
// major/minor split would be lost for exactly the short-lived processes.
SEC("raw_tp/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *p)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	if (!task_watched(p, tgid))
		return 0;
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0; // other threads still run; their counts reach signal_struct on exit
	struct proc_stats *ps = proc_entry(tgid);
	if (!ps)
		return 0;
	ps->exit_min_flt = BPF_CORE_READ(p, signal, min_flt) + BPF_CORE_READ(p, min_flt);
	ps->exit_maj_flt = BPF_CORE_READ(p, signal, maj_flt) + BPF_CORE_READ(p, maj_flt);
	ps->exited = 1;
	return 0;
}

static __always_inline bool interesting_nr(__s64 nr)
{
	return nr == nr_mmap || nr == nr_mlock || nr == nr_mlock2 || nr == nr_munlock ||
	       nr == nr_openat;
}

// sync_kind classifies the blocking waits; futex counts only its wait operations (a
// FUTEX_WAKE never blocks).
static __always_inline __u32 sync_kind(__s64 nr, __u64 arg1)
{
	if (nr == nr_futex) {
		__u32 op = arg1 & 127; // FUTEX_CMD_MASK: without PRIVATE and CLOCK_REALTIME
		// FUTEX_WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2
		if (op == 0 || op == 6 || op == 9 || op == 11 || op == 13)
			return SYNC_FUTEX;
		return SYNC_NONE;
	}
	if (nr == nr_futex_waitv)
		return SYNC_FUTEX;
	if (nr == nr_epoll_wait || nr == nr_epoll_pwait || nr == nr_epoll_pwait2)
		return SYNC_EPOLL;
	if (nr == nr_poll)
		return SYNC_POLL;
	if (nr == nr_ppoll)
		return SYNC_PPOLL;
	if (nr == nr_clock_nanosleep)
		return SYNC_NANOSLEEP;
	return SYNC_NONE;
}

// fd_is_nvidia reports whether the calling task's descriptor fd is a file whose name
// (the dentry's, so what a path to it ends in) starts with "nvidia": /dev/nvidia0,
// /dev/nvidiactl, /dev/nvidia-uvm. The name, not the major number: nvidia-uvm's major is
// assigned at load time.
static __always_inline bool fd_is_nvidia(__u64 fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return false;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) != 0 || !f)
		return false;
	const unsigned char *name = BPF_CORE_READ(f, f_path.dentry, d_name.name);
	char b[8] = {};
	if (bpf_probe_read_kernel_str(b, sizeof(b), name) < 7)
		return false;
	return b[0] == 'n' && b[1] == 'v' && b[2] == 'i' && b[3] == 'd' && b[4] == 'i' &&
	       b[5] == 'a';
}

// ends_with reports whether the string of len bytes in b (a PATH_MAX_LEN buffer) ends
// in suf (sl bytes, at most 12: a loop the verifier bounds).
static __always_inline bool ends_with(const char *b, long len, const char *suf, int sl)
{
	if (len < sl || len >= PATH_MAX_LEN)
		return false;
	for (int i = 0; i < sl && i < 12; i++)
		if (b[(len - sl + i) & (PATH_MAX_LEN - 1)] != suf[i])
			return false;
	return true;
}

// weight_name reports whether a path names a model weight file by its suffix.
static __always_inline bool weight_name(const char *b, long len)
{
	return ends_with(b, len, ".safetensors", 12) || ends_with(b, len, ".gguf", 5) ||
	       ends_with(b, len, ".bin", 4) || ends_with(b, len, ".pt", 3) ||
	       ends_with(b, len, ".pth", 4);
}

// note_weight_open records tgid's first openat of a weight file. The path is read at
// entry (unlike device_opens, read at exit) because the exit of an unwatched process's
// syscall is not followed; a path whose page is not resident yet is missed.
static __always_inline void note_weight_open(struct pt_regs *regs, __u32 tgid)
{
	if (bpf_map_lookup_elem(&weight_opens, &tgid))
		return;
	__u32 zero = 0;
	struct weight_open *w = bpf_map_lookup_elem(&weight_scratch, &zero);
	if (!w)
		return;
	// openat(dirfd, pathname, ...)
	const char *path = (const char *)SYSCALL_ARG1(regs);
	long n = bpf_probe_read_user_str(w->path, sizeof(w->path), path);
	if (n <= 1 || !weight_name(w->path, n - 1))
		return;
	w->ts = bpf_ktime_get_boot_ns();
	w->start_boot = 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (bpf_core_field_exists(task->start_boottime))
		w->start_boot = BPF_CORE_READ(task, group_leader, start_boottime);
	bpf_map_update_elem(&weight_opens, &tgid, w, BPF_NOEXIST);
}

SEC("raw_tp/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	if (id == nr_openat)
		note_weight_open(regs, tgid);
	if (!current_watched(tgid))
		return 0;
	__u32 tid = (__u32)pid_tgid;
	if ((id == nr_read || id == nr_write) && sample_rw > 1) {
		__u32 zero = 0;
		__u64 *seen = bpf_map_lookup_elem(&rw_seen, &zero);
		if (seen && (*seen)++ % sample_rw != 0)
			return 0; // counted at exit, not timed
	}
	struct pending_syscall p = {.nr = id, .flags = PF_TIMED};
	// Only these calls use an argument (futex its op, ioctl its fd, the model-loading
	// calls their length or path): the rest skip two reads of the saved registers.
	if (id == nr_futex || id == nr_ioctl || interesting_nr(id)) {
		p.arg0 = SYSCALL_ARG0(regs);
		p.arg1 = SYSCALL_ARG1(regs);
	}
	p.sync_kind = sync_kind(id, p.arg1);
	if (id == nr_ioctl && fd_is_nvidia(p.arg0))
		p.flags |= PF_NVIDIA;
	// The thread's entry is overwritten in place (sys_exit marks it consumed rather than
	// deleting it; user space drops exited threads' entries): no bucket lock or element
	// recycling on the hot path.
	struct pending_syscall *cur = bpf_map_lookup_elem(&pending_syscalls, &tid);
	p.ts = bpf_ktime_get_ns(); // last, so the work above is not counted as the syscall's
	if (cur) {
		*cur = p;
		return 0;
	}
	if (bpf_map_update_elem(&pending_syscalls, &tid, &p, BPF_NOEXIST) != 0)
		count_err(ERR_PENDING_MAP_FULL);
	return 0;
}

// nvidia_name reports whether the last component of path (n bytes with the NUL, as
// returned by bpf_probe_read_user_str) starts with "nvidia". The scan runs backwards and
// stops at the first '/', so the verifier sees one loop variable and a bounded trip count.
static __always_inline bool nvidia_name(const char *path, long n)
{
	int base = 0;
	for (int k = 0; k < PATH_MAX_LEN; k++) {
		long i = n - 2 - k;
		if (i < 0)
			break;
		i &= PATH_MAX_LEN - 1; // already in range; the mask tells the verifier so
		if (path[i] == '/') {
			base = i + 1;
			break;
		}
	}
	if (base > PATH_MAX_LEN - 7)
		return false;
	const char *b = path + (base & (PATH_MAX_LEN - 1));
	return b[0] == 'n' && b[1] == 'v' && b[2] == 'i' && b[3] == 'd' && b[4] == 'i' &&
	       b[5] == 'a';
}

SEC("raw_tp/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	__u32 tgid = pid_tgid >> 32;
	__u8 w = current_watch(tgid);
	if (!w)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct pending_syscall p = {.nr = -1};
	struct pending_syscall *pp = bpf_map_lookup_elem(&pending_syscalls, &tid);
	if (pp) {
		p = *pp;
		pp->nr = -1; // consumed: a later exit without an entry stamp is not timed
		pp->flags = 0;
	}
	// A live entry holds the number its sys_enter saw, which is this call's (seccomp and
	// tracers change it before sys_enter runs); only an exit without one (sampled out, in
	// progress when the probes attached, a fork's child) reads the saved registers.
	__s64 nr = p.nr;
	if (nr < 0)
		nr = SYSCALL_NR(regs);
	if (nr < 0)
		return 0;                      // no syscall (a tracer or seccomp set it to -1)
	bool failed = ret < 0 && ret >= -4095; // mmap returns addresses; errors are -4095..-1
	bool timed = (p.flags & PF_TIMED) && now > p.ts;
	__u64 ns = timed ? now - p.ts : 0;

	struct lat_stats zero = {};
	struct tgid_key key = {.tgid = tgid, .id = (__u32)nr};
	struct lat_stats *l = lookup_or_init(&syscall_stats, &key, &zero, ERR_SYSCALL_MAP_FULL);
	if (l)
		lat_add(l, timed, ns, failed);
	if (w & WATCH_TOTALS) {
		struct proc_stats *ps = proc_entry(tgid);
		if (ps) {
			__sync_fetch_and_add(&ps->tot_syscalls, 1);
			if (timed) {
				__sync_fetch_and_add(&ps->tot_timed, 1);
				__sync_fetch_and_add(&ps->tot_syscall_ns, ns);
			}
		}
	}
	if (!timed)
		return 0;
	if (p.sync_kind != SYNC_NONE) {
		key.id = p.sync_kind;
		l = lookup_or_init(&sync_stats, &key, &zero, ERR_STATS_MAP_FULL);
		if (l)
			lat_add(l, true, ns, failed);
	}
	if (p.flags & PF_NVIDIA) {
		l = lookup_or_init(&ioctl_stats, &tgid, &zero, ERR_STATS_MAP_FULL);
		if (l)
			lat_add(l, true, ns, failed);
	}
	if (!interesting_nr(nr))
		return 0;
	struct proc_stats *ps = proc_entry(tgid);
	if (!ps)
		return 0;
	bool ok = !failed;
	if (nr == nr_mmap) {
		if (ok) {
			__sync_fetch_and_add(&ps->mmap_count, 1);
			__sync_fetch_and_add(&ps->mmap_bytes, p.arg1);
		}
	} else if (nr == nr_mlock || nr == nr_mlock2) {
		if (ok) {
			__sync_fetch_and_add(&ps->mlock_count, 1);
			__sync_fetch_and_add(&ps->mlock_bytes, p.arg1);
		}
	} else if (nr == nr_munlock) {
		if (ok) {
			__sync_fetch_and_add(&ps->munlock_count, 1);
			__sync_fetch_and_add(&ps->munlock_bytes, p.arg1);
		}
	} else if (nr == nr_openat) {
		__sync_fetch_and_add(&ps->openat_count, 1);
		if (ret < 0)
			__sync_fetch_and_add(&ps->openat_failed, 1);
		// openat(dirfd, pathname, ...): the path is read at exit, once the kernel has
		// faulted the user page in to copy it.
		struct open_event *e = bpf_ringbuf_reserve(&open_events, sizeof(*e), 0);
		if (!e) {
			count_err(ERR_RINGBUF_FULL);
			return 0;
		}
		long n = bpf_probe_read_user_str(e->path, sizeof(e->path), (const void *)p.arg1);
		if (n <= 0 || !nvidia_name(e->path, n)) {
			bpf_ringbuf_discard(e, 0);
			return 0;
		}
		__sync_fetch_and_add(&ps->nvidia_opens, 1);
		e->tgid = tgid;
		e->tid = tid;
		e->ret = ret;
		bpf_ringbuf_submit(e, 0);
	}
	return 0;
}

// ---- TCP ----------------------------------------------------------------------------------

// sock_send_length/sock_recv_length fire in sock_sendmsg/sock_recvmsg with the bytes
// moved (or -errno), in the caller's context: every send/write/recv/read on a socket.
static __always_inline int tcp_account(struct sock *sk, int ret, bool tx)
{
	if (ret <= 0)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!current_watched(tgid) || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP_)
		return 0;
	__u64 key = (__u64)sk;
	// An LRU update takes a lock and an element on every call; the owner rarely changes.
	__u32 *owner = bpf_map_lookup_elem(&sock_owner, &key);
	if (!owner || *owner != tgid)
		bpf_map_update_elem(&sock_owner, &key, &tgid, BPF_ANY);
	struct tcp_stats zero = {};
	struct tcp_stats *t = lookup_or_init(&tcp_stats_map, &tgid, &zero, ERR_STATS_MAP_FULL);
	if (!t)
		return 0;
	if (tx) {
		__sync_fetch_and_add(&t->tx_bytes, ret);
		__sync_fetch_and_add(&t->tx_calls, 1);
	} else {
		__sync_fetch_and_add(&t->rx_bytes, ret);
		__sync_fetch_and_add(&t->rx_calls, 1);
	}
	return 0;
}

SEC("raw_tp/sock_send_length")
int BPF_PROG(sock_send_length, struct sock *sk, int ret, int flags)
{
	return tcp_account(sk, ret, true);
}

SEC("raw_tp/sock_recv_length")
int BPF_PROG(sock_recv_length, struct sock *sk, int ret, int flags)
{
	return tcp_account(sk, ret, false);
}

// A retransmit is charged to the watched process that last moved data on the socket.
SEC("raw_tp/tcp_retransmit_skb")
int BPF_PROG(tcp_retransmit_skb, const struct sock *sk, const struct sk_buff *skb)
{
	__u64 key = (__u64)sk;
	__u32 *owner = bpf_map_lookup_elem(&sock_owner, &key);
	if (!owner)
		return 0;
	__u32 tgid = *owner;
	struct tcp_stats zero = {};
	struct tcp_stats *t = lookup_or_init(&tcp_stats_map, &tgid, &zero, ERR_STATS_MAP_FULL);
	if (t)
		__sync_fetch_and_add(&t->retransmits, 1);
	return 0;
}
