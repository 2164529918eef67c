package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/term"

	"github.com/strap-llm/strap/internal/bpf"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/trace"
	"github.com/strap-llm/strap/internal/units"
)

// topConfig is everything `strapd top` is told on its command line.
type topConfig struct {
	// IntervalS is the refresh interval in seconds (also the snapshot interval).
	IntervalS float64
	// PIDs and Cgroups are watched besides the clients of the daemon's live sessions.
	PIDs    []int
	Cgroups []string
	// Socket is the daemon's control socket ("" resolves as in PROTOCOL.md 1).
	Socket string
	// NoDaemon skips asking a running daemon for its sessions.
	NoDaemon bool
	// NoBPF uses only the /proc fallbacks.
	NoBPF bool
	// Count stops after this many screens; 0 runs until q, SIGINT or SIGTERM.
	Count int
	// Syscalls is how many syscalls per process are listed (by time spent).
	Syscalls int
}

func (c *topConfig) validate() error {
	if !(c.IntervalS >= 0.1) || math.IsInf(c.IntervalS, 0) {
		return fmt.Errorf("--interval %v: must be at least 0.1 seconds", c.IntervalS)
	}
	if c.Count < 0 {
		return fmt.Errorf("--count %d: must not be negative", c.Count)
	}
	if c.Syscalls < 0 {
		return fmt.Errorf("--syscalls %d: must not be negative", c.Syscalls)
	}
	for _, p := range c.PIDs {
		if p <= 0 {
			return fmt.Errorf("--pid %d: must be positive", p)
		}
	}
	return nil
}

func newTopCmd(logger func() *zap.Logger) *cobra.Command {
	cfg := topConfig{}
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of watched processes (off-CPU, faults, syscalls, run queue), disks, PSI and capture sessions",
		Long: `top attaches strapd's probes (as strapd trace does) and redraws one screen per interval:
PSI, every disk with its IOPS, throughput, latency p50/p99 and requests in flight, every
watched process with its off-CPU split, faults/s, RSS, run-queue latency and its slowest
syscalls with p50/p99, and, when a daemon is running, its live capture sessions with
GB/s, compression ratio, drops and tokens/s. The clients of those sessions are watched too.
Percentiles are the upper bound of the log2 bucket that holds them. q quits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.validate(); err != nil {
				return err
			}
			return runTop(cmd.Context(), cfg, logger().With(zap.String("component", "top")))
		},
	}
	f := cmd.Flags()
	f.Float64Var(&cfg.IntervalS, "interval", 1, "seconds per refresh")
	f.IntSliceVar(&cfg.PIDs, "pid", nil, "process (tgid) to watch; repeatable")
	f.StringSliceVar(&cfg.Cgroups, "cgroup", nil, "cgroup v2 directory whose tasks are watched; repeatable")
	f.StringVar(&cfg.Socket, "socket", "", "daemon control socket (default: resolved as in PROTOCOL.md 1)")
	f.BoolVar(&cfg.NoDaemon, "no-daemon", false, "do not ask a running daemon for its sessions")
	f.BoolVar(&cfg.NoBPF, "no-bpf", false, "do not load eBPF probes; /proc fallbacks only")
	f.IntVar(&cfg.Count, "count", 0, "stop after this many screens (0: until q or interrupted)")
	f.IntVar(&cfg.Syscalls, "syscalls", 5, "syscalls listed per process, by time spent")
	return cmd
}

func runTop(parent context.Context, cfg topConfig, log *zap.Logger) error {
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()

	col, err := bpf.Start(bpf.Options{PIDs: cfg.PIDs, Cgroups: cfg.Cgroups, NoBPF: cfg.NoBPF, Logger: log})
	if err != nil {
		return fmt.Errorf("top: %w", err)
	}
	defer col.Close()

	out := os.Stdout
	tty := term.IsTerminal(int(out.Fd()))
	quit := make(chan struct{})
	if tty && term.IsTerminal(int(os.Stdin.Fd())) {
		old, err := term.MakeRaw(int(os.Stdin.Fd()))
		if err != nil {
			return fmt.Errorf("top: terminal: %w", err)
		}
		defer term.Restore(int(os.Stdin.Fd()), old)
		go readKeys(os.Stdin, quit)
	}
	if tty {
		// Alternate screen, cursor hidden; both undone on the way out.
		fmt.Fprint(out, "\x1b[?1049h\x1b[?25l")
		defer fmt.Fprint(out, "\x1b[?25h\x1b[?1049l")
	}

	v := &topView{cfg: cfg, sessionPIDs: map[int]bool{}, lastTokens: map[uint64]uint64{}}
	tick := time.NewTicker(time.Duration(cfg.IntervalS * float64(time.Second)))
	defer tick.Stop()
	for n := 0; cfg.Count == 0 || n < cfg.Count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-quit:
			return nil
		case <-tick.C:
		}
		st := v.pollDaemon(ctx, col, log)
		snap := col.Snapshot()
		width := 120
		if tty {
			if w, _, err := term.GetSize(int(out.Fd())); err == nil && w > 40 {
				width = w
			}
		}
		var b strings.Builder
		if tty {
			b.WriteString("\x1b[H\x1b[2J")
		}
		renderTop(&b, snap, st, v, procComm, width)
		text := b.String()
		if tty {
			// Raw mode turns off the terminal's \n → \r\n translation.
			text = strings.ReplaceAll(text, "\n", "\r\n")
		}
		if _, err := io.WriteString(out, text); err != nil {
			return fmt.Errorf("top: %w", err)
		}
	}
	return nil
}

// readKeys closes quit on q, Q, Ctrl-C or end of input (raw mode delivers Ctrl-C as a byte).
func readKeys(r io.Reader, quit chan<- struct{}) {
	buf := make([]byte, 16)
	for {
		n, err := r.Read(buf)
		for _, c := range buf[:n] {
			if c == 'q' || c == 'Q' || c == 3 {
				close(quit)
				return
			}
		}
		if err != nil {
			close(quit)
			return
		}
	}
}

// topView is what top remembers between screens.
type topView struct {
	cfg topConfig
	// sessionPIDs are the session clients top added to the collector's filter.
	sessionPIDs map[int]bool
	// lastTokens and lastAt turn the sessions' token counters into rates.
	lastTokens map[uint64]uint64
	lastAt     time.Time
	// daemonErr is why the last status request failed ("" when it did not).
	daemonErr string
}

// topSessions is the daemon's part of one screen.
type topSessions struct {
	rep       control.StatusReply
	tokensPer map[uint64]float64
}

// pollDaemon asks the daemon for its sessions and watches their clients; nil when no
// daemon answers (the reason is kept for the screen).
func (v *topView) pollDaemon(ctx context.Context, col *bpf.Collector, log *zap.Logger) *topSessions {
	if v.cfg.NoDaemon {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := control.Dial(dctx, control.ClientSocketPath(v.cfg.Socket), "strapd-top/"+version)
	if err != nil {
		v.daemonErr = err.Error()
		return nil
	}
	defer c.Disconnect()
	rep, err := c.Status()
	if err != nil {
		v.daemonErr = err.Error()
		return nil
	}
	v.daemonErr = ""
	now := time.Now()
	dt := now.Sub(v.lastAt).Seconds()
	st := &topSessions{rep: rep, tokensPer: map[uint64]float64{}}
	live := map[int]bool{}
	tokens := map[uint64]uint64{}
	for _, s := range rep.Sessions {
		tokens[s.Session] = s.Tokens
		if prev, ok := v.lastTokens[s.Session]; ok && dt > 0 && s.Tokens >= prev {
			st.tokensPer[s.Session] = float64(s.Tokens-prev) / dt
		}
		pid := int(s.PID)
		live[pid] = true
		if pid > 0 && !v.sessionPIDs[pid] && !slices.Contains(v.cfg.PIDs, pid) {
			if err := col.Watch(pid); err != nil {
				log.Debug("watch session client", zap.Int("pid", pid), zap.Error(err))
				continue
			}
			v.sessionPIDs[pid] = true
		}
	}
	for pid := range v.sessionPIDs {
		if !live[pid] {
			_ = col.Unwatch(pid) // the process may be gone already; its counts were reported
			delete(v.sessionPIDs, pid)
		}
	}
	v.lastTokens, v.lastAt = tokens, now
	return st
}

// procComm is a process's command name, "?" once it is gone.
func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// quantileUs is the upper bound in µs of the log2 bucket holding quantile q; -1 when empty.
func quantileUs(buckets []trace.Bucket, q float64) int64 {
	var total uint64
	for _, b := range buckets {
		total += b.Count
	}
	if total == 0 {
		return -1
	}
	limit := q * float64(total)
	var cum uint64
	for _, b := range buckets {
		cum += b.Count
		if float64(cum) >= limit {
			return int64(b.BucketHigh) + 1
		}
	}
	return int64(buckets[len(buckets)-1].BucketHigh) + 1
}

func fmtUs(us int64) string {
	switch {
	case us < 0:
		return "-"
	case us < 10000:
		return strconv.FormatInt(us, 10) + "µs"
	case us < 10_000_000:
		return strconv.FormatInt(us/1000, 10) + "ms"
	default:
		return strconv.FormatInt(us/1_000_000, 10) + "s"
	}
}

func perSec(n uint64, s float64) float64 {
	if s <= 0 {
		return 0
	}
	return float64(n) / s
}

// renderTop draws one screen. It is a pure function of its inputs so tests can check
// the text without a terminal.
func renderTop(b *strings.Builder, s trace.Snapshot, st *topSessions, v *topView, comm func(int) string, width int) {
	line := func(format string, a ...any) {
		l := fmt.Sprintf(format, a...)
		if r := []rune(l); len(r) > width {
			l = string(r[:width])
		}
		b.WriteString(l)
		b.WriteByte('\n')
	}
	line("strapd top  %s  every %.1fs  watched %d  (q quits)", s.ISOTimestamp, s.IntervalS, len(s.Watched))

	var psi []string
	for _, r := range trace.PSIResources {
		p, ok := s.Pressure[r]
		if !ok || p.Some == nil {
			continue
		}
		f := "-"
		if p.Full != nil {
			f = fmt.Sprintf("%.1f%%", p.Full.Avg10)
		}
		psi = append(psi, fmt.Sprintf("%s some %.1f%% full %s", r, p.Some.Avg10, f))
	}
	if len(psi) == 0 {
		line("PSI (avg10)  not available")
	} else {
		line("PSI (avg10)  %s", strings.Join(psi, "   "))
	}

	line("")
	line("DISK          R IOPS   W IOPS    R MB/s    W MB/s  LAT p50  LAT p99  IN-FLIGHT")
	hist := map[string][]trace.Bucket{}
	for _, h := range s.LatencyHistogram {
		hist[h.DeviceName] = h.Buckets
	}
	inflight := map[string]int64{}
	for _, d := range s.Inflight {
		inflight[d.DeviceName] = d.Count
	}
	if len(s.BlockIO) == 0 {
		line("  (no completed requests)")
	}
	for _, d := range s.BlockIO {
		line("%-10s %9.1f %8.1f %9.2f %9.2f %8s %8s %10d", d.DeviceName, d.ReadIOPS, d.WriteIOPS,
			perSec(d.ReadBytes, s.IntervalS)/1e6, perSec(d.WriteBytes, s.IntervalS)/1e6,
			fmtUs(quantileUs(hist[d.DeviceName], 0.5)), fmtUs(quantileUs(hist[d.DeviceName], 0.99)), inflight[d.DeviceName])
	}

	line("")
	line("PROCESS             off-CPU ms/s: RUNNABLE    SLEEP  IO-WAIT  FAULTS/s  MAJ/s       RSS  RUNQ p50  RUNQ p99  CSW/s")
	if len(s.Watched) == 0 {
		line("  (no watched process: --pid, --cgroup, or a live capture session)")
	}
	for _, pid := range s.Watched {
		k := strconv.Itoa(pid)
		oc := s.OffCPU[k]
		pf := s.PageFaultsDetail[k]
		sc := s.Sched[k]
		rss := "-"
		if m, ok := s.Memory[k]; ok {
			rss = units.Bytes(float64(m.RSSBytes))
		}
		rq := s.RunqueueLatency[k].Buckets
		ms := func(ns uint64) float64 { return perSec(ns, s.IntervalS) / 1e6 }
		name := fmt.Sprintf("%d %s", pid, comm(pid))
		line("%-20.20s %23.0f %8.0f %8.0f %9.0f %6.0f %9s %9s %9s %6.0f", name, ms(oc.RunnableNs), ms(oc.SleepNs), ms(oc.IONs),
			perSec(s.PageFaults[k], s.IntervalS), perSec(pf.Major, s.IntervalS), rss,
			fmtUs(quantileUs(rq, 0.5)), fmtUs(quantileUs(rq, 0.99)), perSec(sc.Voluntary+sc.Involuntary, s.IntervalS))
		type named struct {
			name string
			l    trace.LatencyStats
		}
		var calls []named
		for n, l := range s.SyscallLatency[k] {
			calls = append(calls, named{n, l})
		}
		slices.SortFunc(calls, func(a, b named) int {
			if a.l.TotalNs != b.l.TotalNs {
				if a.l.TotalNs > b.l.TotalNs {
					return -1
				}
				return 1
			}
			return strings.Compare(a.name, b.name)
		})
		for _, c := range calls[:min(len(calls), v.cfg.Syscalls)] {
			line("    %-18s %8.0f/s  p50 %7s  p99 %7s  %8.1f ms/s  err %d", c.name, perSec(c.l.Count, s.IntervalS),
				fmtUs(quantileUs(c.l.Buckets, 0.5)), fmtUs(quantileUs(c.l.Buckets, 0.99)), ms(c.l.TotalNs), c.l.Errors)
		}
	}

	line("")
	switch {
	case v.cfg.NoDaemon:
		line("SESSIONS  (not asked: --no-daemon)")
	case st == nil:
		line("SESSIONS  no daemon: %s", v.daemonErr)
	default:
		d := st.rep.Daemon
		line("SESSIONS  strapd %s pid %d  %d live", d.Version, d.PID, d.Sessions)
		line("  SESSION      PID  MODEL                 IN GB/s  OUT GB/s   RATIO   DROPS  TOKENS/s  RING")
		for _, x := range st.rep.Sessions {
			tps := "-"
			if r, ok := st.tokensPer[x.Session]; ok {
				tps = fmt.Sprintf("%.1f", r)
			}
			ratio := "-"
			if x.Ratio > 0 {
				ratio = fmt.Sprintf("%.2fx", x.Ratio)
			}
			line("  %7d %8d  %-20.20s %8.3f %9.3f %7s %7d %9s %4.0f%%", x.Session, x.PID, x.ModelClass,
				x.InMBps/1000, x.OutMBps/1000, ratio, x.Drops, tps, 100*x.RingFill)
		}
	}
	if drops := dropsLine(s.Drops); drops != "" {
		line("")
		line("PROBE DROPS  %s", drops)
	}
}

func dropsLine(d map[string]uint64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(d)) {
		if d[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, d[k]))
		}
	}
	return strings.Join(parts, "  ")
}
