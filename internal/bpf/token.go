package bpf

import "github.com/strap-llm/strap/internal/trace"

// TokenWindow is the TokenKernel for the window between two ProcessTotals readings of
// the same process (counters that went backwards, e.g. a removed exited thread, give 0).
func TokenWindow(prev, cur ProcessTotals) trace.TokenKernel {
	oc := trace.OffCPU{RunnableNs: dropSub(cur.OffCPU.RunnableNs, prev.OffCPU.RunnableNs), SleepNs: dropSub(cur.OffCPU.SleepNs, prev.OffCPU.SleepNs),
		IONs: dropSub(cur.OffCPU.IONs, prev.OffCPU.IONs)}
	oc.BlockedNs = oc.SleepNs + oc.IONs
	return trace.TokenKernel{OffCPUNs: oc.RunnableNs + oc.SleepNs + oc.IONs, OffCPU: oc,
		PageFaults: dropSub(cur.PageFaults, prev.PageFaults), SyscallCount: dropSub(cur.SyscallCount, prev.SyscallCount),
		SyscallTimed: dropSub(cur.SyscallTimed, prev.SyscallTimed), SyscallNs: dropSub(cur.SyscallNs, prev.SyscallNs),
		BlockReadBytes: dropSub(cur.ReadBytes, prev.ReadBytes), BlockWriteBytes: dropSub(cur.WriteBytes, prev.WriteBytes)}
}

// dropSub is a-b, or 0 when a sum went backwards (a thread's entry was removed): the
// window then undercounts rather than reporting a lifetime total.
func dropSub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
