package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/strap-llm/strap/internal/control"
)

// printProbes prints STATUS_REPLY's daemon.probes: each collector's source (with the
// reason when it is not on BPF) and the probes' cumulative run statistics.
func printProbes(w io.Writer, p *control.ProbesStatus) {
	if p == nil {
		fmt.Fprintln(w, "probes: off (serve --no-probes)")
		return
	}
	if !p.Enabled {
		fmt.Fprintf(w, "probes: not started: %s\n", p.Error)
		return
	}
	var pids []string
	for _, pid := range p.Watched {
		pids = append(pids, fmt.Sprint(pid))
	}
	fmt.Fprintf(w, "probes: every %gs, %d snapshots, %d sessions tracing, watching [%s]\n",
		p.IntervalS, p.Snapshots, p.TraceSessions, strings.Join(pids, " "))
	for _, c := range p.Collectors {
		state := "attached"
		switch {
		case c.Source == control.ProbeSourceBPF:
		case c.Error != "":
			state = "not attached, fallback " + c.Source
		case c.Source == control.ProbeSourceProc:
			state = "reads /proc"
		default:
			state = c.Source
		}
		line := fmt.Sprintf("  %-12s %-8s %s", c.Name, c.Source, state)
		if c.Error != "" {
			line += ": " + c.Error
		}
		fmt.Fprintln(w, line)
	}
	if p.StatsError != "" {
		fmt.Fprintf(w, "  bpf run stats unavailable: %s\n", p.StatsError)
	}
	if len(p.BPFStats) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  PROGRAM\tEVENTS\tNS/EVENT\tRECURSION MISSES")
		for _, s := range p.BPFStats {
			fmt.Fprintf(tw, "  %s\t%d\t%.0f\t%d\n", s.Program, s.TotalEvents, s.NsPerEvent, s.RecursionMisses)
		}
		tw.Flush()
	}
	for _, reason := range slices.Sorted(maps.Keys(p.Drops)) {
		fmt.Fprintf(w, "  dropped events %s: %d\n", reason, p.Drops[reason])
	}
}
