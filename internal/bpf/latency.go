package bpf

import (
	"maps"
	"slices"
	"strconv"

	"github.com/strap-llm/strap/internal/trace"
)

// latCounters is one cumulative lat_stats entry of the probes.
type latCounters struct {
	count, errors, timed, totalNs uint64
	slots                         [maxSlots]uint64
}

// tgidID keys the probes' per-process stats split by syscall number or sync-wait kind.
type tgidID struct{ tgid, id uint32 }

// Sync-wait kinds as the probes number them (SYNC_* in bpf/strap.bpf.c).
var syncKindNames = []string{"futex", "epoll_wait", "poll", "ppoll", "clock_nanosleep"}

// latDelta is cur minus prev as LatencyStats; ok is false when nothing happened.
func latDelta(cur, prev latCounters) (trace.LatencyStats, bool) {
	if cur.count < prev.count {
		prev = latCounters{} // the entry was recreated (pid reuse): count from zero
	}
	l := trace.LatencyStats{Count: cur.count - prev.count, Errors: sub(cur.errors, prev.errors), Timed: sub(cur.timed, prev.timed),
		TotalNs: sub(cur.totalNs, prev.totalNs), Buckets: []trace.Bucket{}}
	for slot := range maxSlots {
		if n := sub(cur.slots[slot], prev.slots[slot]); n > 0 {
			l.Buckets = append(l.Buckets, trace.Bucket{Slot: slot, Count: n, BucketLow: (uint64(1) << slot) >> 1, BucketHigh: uint64(1)<<slot - 1})
		}
	}
	return l, l.Count > 0
}

// syscallName names a syscall number of this build's architecture; unknown numbers read
// "syscall_<nr>".
func syscallName(nr uint32) string {
	if n, ok := syscallNames[nr]; ok {
		return n
	}
	return "syscall_" + strconv.FormatUint(uint64(nr), 10)
}

func syncKindName(kind uint32) string {
	if int(kind) < len(syncKindNames) {
		return syncKindNames[kind]
	}
	return "kind_" + strconv.FormatUint(uint64(kind), 10)
}

// byTgid groups a (tgid, id) map's entries of one tgid by name, as deltas against prev.
func byTgid(cur, prev map[tgidID]latCounters, tgid uint32, name func(uint32) string) map[string]trace.LatencyStats {
	var out map[string]trace.LatencyStats
	for _, k := range slices.SortedFunc(maps.Keys(cur), func(a, b tgidID) int { return int(a.id) - int(b.id) }) {
		if k.tgid != tgid {
			continue
		}
		if l, ok := latDelta(cur[k], prev[k]); ok {
			if out == nil {
				out = map[string]trace.LatencyStats{}
			}
			out[name(k.id)] = l
		}
	}
	return out
}

// tcpDelta is cur minus prev; ok is false when nothing happened.
func tcpDelta(cur, prev trace.TCP) (trace.TCP, bool) {
	if cur.TxCalls < prev.TxCalls || cur.RxCalls < prev.RxCalls || cur.Retransmits < prev.Retransmits {
		prev = trace.TCP{}
	}
	d := trace.TCP{TxBytes: sub(cur.TxBytes, prev.TxBytes), RxBytes: sub(cur.RxBytes, prev.RxBytes),
		TxCalls: sub(cur.TxCalls, prev.TxCalls), RxCalls: sub(cur.RxCalls, prev.RxCalls),
		Retransmits: sub(cur.Retransmits, prev.Retransmits)}
	return d, d != trace.TCP{}
}
