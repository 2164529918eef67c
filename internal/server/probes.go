package server

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/bpf"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/trace"
)

// Probes configures the eBPF collector that runs beside the captures
// (docs/TRACE_FORMAT.md). The zero value runs none.
type Probes struct {
	// Enabled starts one bpf.Collector with the server. Without it an OPEN carrying a
	// trace descriptor is refused (bad_output).
	Enabled bool
	// Interval is the time between snapshots; 0 means DefaultTraceInterval.
	Interval time.Duration
	// PerThread adds the per-thread breakdown to every snapshot.
	PerThread bool
	// NoBPF skips the kernel probes and uses only the /proc fallbacks.
	NoBPF bool
	// SampleReadWrite times one read/write syscall in N (0 and 1: every one).
	SampleReadWrite int
}

// DefaultTraceInterval is the snapshot interval when Probes.Interval is 0.
const DefaultTraceInterval = 5 * time.Second

// finalSnapshotWait bounds how long a finishing session waits for its last snapshot.
const finalSnapshotWait = 5 * time.Second

// idleSnapshotEvery: while nothing reads snapshots (no metrics observer, no traced
// session), the ticker takes one every idleSnapshotEvery intervals instead of every
// interval. A snapshot reads every watched thread's /proc files and walks the probes'
// maps: at 5 s intervals it was 10-35 % of strapd's CPU over untraced decode captures
// (PERFORMANCE.md, issue 38), all of it thrown away. The rare one keeps the maps swept
// and the collector's deltas short; a traced session that starts after idle ticks asks
// for a baseline first, so its first line covers at most one interval, as before.
const idleSnapshotEvery = 12

// probeHub owns the server's one Collector, the one ticker that calls Snapshot, and the
// trace writers of the live sessions that asked for one.
type probeHub struct {
	log      *zap.Logger
	coll     *bpf.Collector // nil when disabled or failed to start
	startErr error
	interval time.Duration
	self     int
	observe  func(trace.Snapshot) // metrics; nil: none

	final chan chan struct{} // a finishing session asks the ticker for one more snapshot
	// baseline: a traced session started; after idle ticks the ticker takes a snapshot
	// that no one gets, so the session's first line starts near its start.
	baseline chan struct{}
	stop     chan struct{}
	done     chan struct{}

	mu        sync.Mutex
	live      map[uint64]*probeSession
	ended     []trace.Session // ended since the last snapshot: still named in it
	refs      map[int]int     // watched pid -> live sessions of that client
	snapshots uint64
}

// probeSession is one live session as the probes see it.
type probeSession struct {
	info trace.Session

	mu    sync.Mutex // serialises the ticker's writes with the session's close
	trace *os.File   // nil: the session asked for no trace
	w     *trace.Writer
	lines int
	err   error // first write error; later snapshots are not attempted

	// Per-token kernel attribution (traced sessions only): the client's counters at the
	// last TOKEN (or OPEN), and the windows not yet written to the trace.
	last     bpf.ProcessTotals
	lastAt   time.Time
	tokens   []trace.TokenKernel
	tokenErr error // the first failed reading; no more windows after it
	// loads is the client's model-load phase, ended by the first PUBLISH, not yet written.
	loads []trace.ModelLoad
}

// startProbes starts the collector and its ticker when Config.Probes asks for them. A
// collector that cannot start is logged once and reported by STATUS; captures still run.
func (s *Server) startProbes() {
	p := s.cfg.Probes
	if !p.Enabled {
		return
	}
	h := &probeHub{log: s.root.With(zap.String("component", "probes")), interval: p.Interval, self: os.Getpid(),
		final: make(chan chan struct{}), baseline: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		live: map[uint64]*probeSession{}, refs: map[int]int{}}
	if h.interval <= 0 {
		h.interval = DefaultTraceInterval
	}
	coll, err := bpf.Start(bpf.Options{WatchSelf: true, PerThread: p.PerThread, NoBPF: p.NoBPF,
		SampleReadWrite: p.SampleReadWrite, Logger: h.log})
	if err != nil {
		h.startErr = err
		h.log.Error("probes not started; captures run without traces", zap.Error(err))
		close(h.done)
		s.probes = h
		return
	}
	h.coll = coll
	if s.cfg.Observer != nil {
		h.observe = s.cfg.Observer.ObserveSnapshot
	}
	coll.SetSessions(h.sessions)
	var srcs []string
	for _, c := range coll.Status().Collectors {
		srcs = append(srcs, c.Name+"="+c.Source)
	}
	h.log.Info("probes started", zap.Duration("interval", h.interval), zap.Strings("collectors", srcs))
	s.probes = h
	go h.tick()
}

// stopProbes stops the ticker and closes the collector; sessions still open write no more
// snapshots but are closed cleanly when they finish.
func (s *Server) stopProbes() error {
	h := s.probes
	if h == nil || h.coll == nil {
		return nil
	}
	close(h.stop)
	<-h.done
	return h.coll.Close()
}

// tick is the only caller of Snapshot: every interval while something reads snapshots
// (every idleSnapshotEvery intervals while nothing does), once more for each finishing
// session that has a trace, so even a session shorter than the interval gets its lines,
// and as a baseline when a traced session starts after idle ticks.
func (h *probeHub) tick() {
	defer close(h.done)
	t := time.NewTicker(h.interval)
	defer t.Stop()
	skipped := 0 // idle ticks since the last snapshot
	for {
		var reply chan struct{}
		base := false
		select {
		case <-h.stop:
			return
		case <-t.C:
			if !h.wanted() && skipped+1 < idleSnapshotEvery {
				skipped++
				continue
			}
		case reply = <-h.final:
		case <-h.baseline:
			if skipped == 0 {
				continue // the last snapshot is at most an interval old
			}
			base = true
		}
		skipped = 0
		snap := h.coll.Snapshot()
		if h.observe != nil {
			h.observe(snap)
		}
		h.mu.Lock()
		h.snapshots++
		var targets []*probeSession
		for _, ps := range h.live {
			if ps.trace != nil && !base {
				targets = append(targets, ps)
			}
		}
		h.mu.Unlock()
		for _, ps := range targets {
			ps.write(snap, h.log)
		}
		if reply != nil {
			close(reply)
		}
	}
}

// wanted reports whether a snapshot now has a reader: the metrics observer, or a live
// session with a trace.
func (h *probeHub) wanted() bool {
	if h.observe != nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ps := range h.live {
		if ps.trace != nil {
			return true
		}
	}
	return false
}

// sessions is the Collector's SetSessions callback: the live sessions plus those that
// ended since the last snapshot, sorted by id. It consumes the ended list.
func (h *probeHub) sessions() []trace.Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.ended
	h.ended = nil
	for _, ps := range h.live {
		out = append(out, ps.info)
	}
	slices.SortFunc(out, func(a, b trace.Session) int {
		x, _ := strconv.ParseUint(a.ID, 10, 64)
		y, _ := strconv.ParseUint(b.ID, 10, 64)
		return cmp.Compare(x, y)
	})
	return slices.CompactFunc(out, func(a, b trace.Session) bool { return a.ID == b.ID })
}

func (ps *probeSession) write(snap trace.Snapshot, log *zap.Logger) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.w == nil || ps.err != nil {
		return
	}
	snap.TokensKernel, ps.tokens = ps.tokens, nil
	snap.ModelLoad, ps.loads = ps.loads, nil
	if err := ps.w.Write(snap); err != nil {
		ps.err = err
		log.Warn("trace write failed; no more snapshots for this session", zap.String("session", ps.info.ID), zap.Error(err))
		return
	}
	ps.lines++
}

// checkTrace validates OPEN's optional trace descriptor (openFDs.trace): a regular file
// open for writing (O_APPEND allowed: lines are whole writes). nil when there is none (-1).
func (s *Server) checkTrace(fd int) error {
	if fd < 0 {
		return nil
	}
	if s.probes == nil {
		return perr(control.CodeBadOutput, "trace descriptor given but this strapd runs without probes (serve --no-probes)")
	}
	if s.probes.coll == nil {
		return perr(control.CodeBadOutput, "trace descriptor given but the probes did not start: %v", s.probes.startErr)
	}
	_, err := checkWritableFile(fd, "trace", "open it O_WRONLY|O_CREAT|O_TRUNC, or O_RDWR|O_APPEND to resume")
	return err
}

// probeSessionStart registers a started session with the probes: its client is watched
// and, when traceFile is not nil, every snapshot until the session ends is written into it.
// It takes ownership of traceFile.
func (s *Server) probeSessionStart(id uint64, output string, pid int, traceFile *os.File) {
	h := s.probes
	if h == nil || h.coll == nil {
		if traceFile != nil {
			traceFile.Close()
		}
		return
	}
	ps := &probeSession{info: trace.Session{ID: strconv.FormatUint(id, 10), Output: output, PID: pid}, trace: traceFile}
	if traceFile != nil {
		// A trace continued by a resumed capture may end in a line torn by a crash: cut it
		// before appending (possible only when the client opened it readable, O_RDWR).
		if fl, err := unix.FcntlInt(traceFile.Fd(), unix.F_GETFL, 0); err == nil && fl&unix.O_ACCMODE == unix.O_RDWR {
			if cut, err := trace.RepairFile(traceFile); err != nil {
				h.log.Warn("trace tail not repaired; appending anyway", zap.Uint64("session", id), zap.Error(err))
			} else if cut > 0 {
				h.log.Info("cut a torn line from the trace", zap.Uint64("session", id), zap.Int64("bytes", cut))
			}
		}
		ps.w = trace.NewWriter(traceFile, trace.WriterOptions{})
	}
	h.mu.Lock()
	h.live[id] = ps
	first := h.refs[pid] == 0
	h.refs[pid]++
	h.mu.Unlock()
	if first && pid != h.self && pid > 0 {
		if err := h.coll.Watch(pid); err != nil {
			h.log.Warn("cannot watch session client", zap.Uint64("session", id), zap.Int("pid", pid), zap.Error(err))
		}
	}
	if traceFile != nil {
		select {
		case h.baseline <- struct{}{}:
		default: // one is pending already
		}
	}
	if traceFile != nil && pid > 0 {
		// Its totals are read at every TOKEN: one lookup when the probes keep them, else
		// a read of the thread and syscall tables.
		if err := h.coll.TrackTotals(pid); err != nil && !errors.Is(err, bpf.ErrUnsupported) {
			h.log.Debug("per-process totals not kept in the kernel", zap.Uint64("session", id), zap.Int("pid", pid), zap.Error(err))
		}
		ps.mu.Lock()
		ps.lastAt = time.Now()
		ps.last, ps.tokenErr = h.coll.ProcessTotals(pid)
		ps.mu.Unlock()
	}
}

// liveProbeSession is the probe hub and the registered session id, or a nil session
// when the collector is not running or id is not registered.
func (s *Server) liveProbeSession(id uint64) (*probeHub, *probeSession) {
	h := s.probes
	if h == nil || h.coll == nil {
		return h, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h, h.live[id]
}

// probeToken records the kernel activity of the session's client since its previous TOKEN
// (or OPEN); the window goes into the next snapshot line of the session's trace. Sessions
// without a trace are not sampled.
func (s *Server) probeToken(id uint64, t control.Token) {
	h, ps := s.liveProbeSession(id)
	if ps == nil || ps.trace == nil || ps.info.PID <= 0 {
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.tokenErr != nil {
		return
	}
	now := time.Now()
	cur, err := h.coll.ProcessTotals(ps.info.PID)
	if err != nil {
		ps.tokenErr = err
		h.log.Warn("per-token kernel counters unavailable for this session", zap.Uint64("session", id), zap.Error(err))
		return
	}
	w := bpf.TokenWindow(ps.last, cur)
	w.Session, w.Index, w.TokenID, w.PID = ps.info.ID, t.Index, t.TokenID, ps.info.PID
	w.Timestamp = float64(now.UnixMicro()) / 1e6
	w.WindowS = now.Sub(ps.lastAt).Seconds()
	ps.tokens = append(ps.tokens, w)
	ps.last, ps.lastAt = cur, now
}

// probeFirstPublish ends the model-load phase of a session's client at the session's first
// PUBLISH (the first forward pass the client reports): when the probes saw the client open
// a weight file, the phase is logged and, for a traced session, goes into its next trace
// line. An untraced session takes the phase too: a later traced one must not report a load
// that ended before it.
func (s *Server) probeFirstPublish(id uint64) {
	h, ps := s.liveProbeSession(id)
	if ps == nil || ps.info.PID <= 0 {
		return
	}
	ml, ok, err := h.coll.TakeModelLoad(ps.info.ID, ps.info.PID)
	if err != nil {
		if !errors.Is(err, bpf.ErrUnsupported) && !errors.Is(err, bpf.ErrClosed) {
			h.log.Warn("model-load phase not read", zap.Uint64("session", id), zap.Error(err))
		}
		return
	}
	if !ok {
		return
	}
	h.log.Info("model load", zap.Uint64("session", id), zap.Int("pid", ml.PID), zap.String("path", ml.Path),
		zap.Float64("duration_s", ml.DurationS))
	if ps.trace == nil {
		return
	}
	ps.mu.Lock()
	ps.loads = append(ps.loads, ml)
	ps.mu.Unlock()
}

// probeSessionEnd unregisters a finished session: a traced one first gets a last snapshot
// covering its end, then its trace is flushed, fsynced and closed; its client is unwatched
// when no other live session belongs to it. The error is the trace's (the capture is not
// affected by it).
func (s *Server) probeSessionEnd(id uint64) error {
	h, ps := s.liveProbeSession(id)
	if ps == nil {
		return nil
	}
	if ps.trace != nil {
		reply := make(chan struct{})
		select {
		case h.final <- reply:
			select {
			case <-reply:
			case <-time.After(finalSnapshotWait):
			}
		case <-h.done:
		case <-time.After(finalSnapshotWait):
		}
	}
	h.mu.Lock()
	delete(h.live, id)
	h.ended = append(h.ended, ps.info)
	pid := ps.info.PID
	h.refs[pid]--
	last := h.refs[pid] <= 0
	if last {
		delete(h.refs, pid)
	}
	h.mu.Unlock()
	if last && pid != h.self && pid > 0 {
		// Its counts up to now still appear in the next snapshot (bpf.Collector.Unwatch).
		if err := h.coll.Unwatch(pid); err != nil && !errors.Is(err, bpf.ErrClosed) {
			h.log.Warn("cannot unwatch session client", zap.Int("pid", pid), zap.Error(err))
		}
	}
	if ps.trace == nil {
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	err := ps.err
	if cerr := ps.w.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if serr := ps.trace.Sync(); serr != nil && err == nil {
		err = fmt.Errorf("fsync trace: %w", serr)
	}
	if cerr := ps.trace.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close trace: %w", cerr)
	}
	ps.w = nil
	if err != nil {
		h.log.Warn("session trace incomplete", zap.Uint64("session", id), zap.Int("lines", ps.lines), zap.Error(err))
	} else {
		h.log.Debug("session trace closed", zap.Uint64("session", id), zap.Int("lines", ps.lines))
	}
	return err
}

// probeStatus is STATUS_REPLY's daemon.probes; nil when the daemon runs without probes.
func (s *Server) probeStatus() *control.ProbesStatus {
	h := s.probes
	if h == nil {
		return nil
	}
	h.mu.Lock()
	ps := &control.ProbesStatus{Enabled: h.coll != nil, IntervalS: h.interval.Seconds(), Snapshots: h.snapshots}
	for _, p := range h.live {
		if p.trace != nil {
			ps.TraceSessions++
		}
	}
	h.mu.Unlock()
	if h.startErr != nil {
		ps.Error = h.startErr.Error()
	}
	if h.coll != nil {
		fillProbes(ps, h.coll.Status())
	}
	return ps
}

// fillProbes copies the collector's status into its wire form (control stays free of bpf).
func fillProbes(ps *control.ProbesStatus, st bpf.Status) {
	for _, c := range st.Collectors {
		ps.Collectors = append(ps.Collectors, control.ProbeCollector{Name: c.Name, Source: c.Source, Programs: c.Programs, Error: c.Error})
	}
	for _, p := range st.BPFStats {
		ps.BPFStats = append(ps.BPFStats, control.ProbeProgStats(p))
	}
	ps.Watched, ps.Cgroups, ps.StatsError, ps.Drops = st.Watched, st.Cgroups, st.StatsError, st.Drops
}
