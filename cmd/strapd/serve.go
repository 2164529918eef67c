package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/httpapi"
	"github.com/strap-llm/strap/internal/server"
	"github.com/strap-llm/strap/internal/shm"
)

// serveConfig is everything `strapd serve` is told on its command line.
type serveConfig struct {
	// Socket is the control socket path; empty resolves per PROTOCOL.md 1. A socket
	// systemd passes (socket activation) takes precedence.
	Socket string
	// Access decides who may connect (docs/DEPLOY.md).
	Access struct {
		// SocketGroup is the group given the socket; members may connect.
		SocketGroup string
		// SocketGroupSet is true when --socket-group was given: a missing group is then an
		// error instead of a warning.
		SocketGroupSet bool
		// SocketMode is the socket's permission bits, as octal text.
		SocketMode string
		// AllowUIDs, when not empty, are the only uids (besides root) that may connect.
		AllowUIDs []uint
		// AllowGIDs, when not empty, are groups whose members may connect.
		AllowGIDs []uint
	}
	// Clients bound what one client or one uid may take.
	Clients struct {
		// MaxConns is the most connections open at once.
		MaxConns int
		// MaxConnsPerUID is the most connections one uid may hold.
		MaxConnsPerUID int
		// MaxSessionsPerUID is the most sessions one uid may hold.
		MaxSessionsPerUID int
		// ConnectRate is the new connections per second allowed per uid.
		ConnectRate float64
		// RequestRate is the control messages per second allowed per connection.
		RequestRate float64
	}
	// LogFile, when set, receives the log (JSON lines) instead of stderr; SIGHUP reopens it.
	LogFile string
	// Memory bounds what the daemon may hold.
	Memory struct {
		// Limit counts ring mappings plus compression buffers in flight; its default is
		// server.DefaultMemoryLimit (a quarter of the host's memory).
		Limit byteSize
	}
	// Pipeline sizes the compression pool.
	Pipeline struct {
		// Workers is the number of compression goroutines; 0 means GOMAXPROCS.
		Workers int
		// MaxBlockSize is the largest block_size a client may ask for.
		MaxBlockSize byteSize
		// CPUBudget is the CPUs compression may use, all sessions together (< 0: unlimited).
		CPUBudget float64
	}
	// Limits protect the daemon from clients asking too much.
	Limits struct {
		// MaxSessions is the most sessions open at once.
		MaxSessions int
		// MaxRingSize is the largest ring a client may open.
		MaxRingSize byteSize
		// MaxNameLen is the longest module name accepted in a record.
		MaxNameLen int
		// MaxNDim is the most tensor dimensions accepted in a record.
		MaxNDim int
		// MaxElements is the most elements one captured tensor may have.
		MaxElements uint64
	}
	// ShutdownTimeout bounds how long SIGTERM waits for sessions to drain.
	ShutdownTimeout time.Duration
	// ExitIdle, when positive, exits cleanly after this long with no client connected.
	ExitIdle time.Duration
	// SchedIdle runs every thread of the daemon under SCHED_IDLE (schedIdle).
	SchedIdle bool
	// IdleWorkers runs only the compression workers under SCHED_IDLE (pipeline.Pool).
	IdleWorkers bool
	// NarrowProcs runs the Go runtime on one P while at most one session is open and the
	// compression pool is idle (pipeline.PoolOptions.NarrowProcs).
	NarrowProcs bool
	// Probes configures the eBPF collector beside the captures (docs/TRACE_FORMAT.md).
	Probes struct {
		// Off runs no collector: no traces (an OPEN with a trace file is refused).
		Off bool
		// NoBPF skips the kernel probes; only the /proc fallbacks run.
		NoBPF bool
		// Interval is the time between snapshots (0: server.DefaultTraceInterval).
		Interval time.Duration
		// PerThread adds the per-thread breakdown to every snapshot.
		PerThread bool
		// SampleReadWrite times one read/write syscall in N (1: every one).
		SampleReadWrite int
	}
	// HTTP serves /metrics and the JSON API (docs/HTTP_API.md); off unless --http is set.
	HTTP httpConfig
	// Upload sends streams to object storage while they are captured (upload.go).
	Upload uploadConfig
	// Debug holds hidden test options.
	Debug struct {
		// WriteDelay sleeps this long after every packet written (tests fill tiny rings).
		WriteDelay time.Duration
		// Trace writes a Go execution trace (runtime/trace) to this file from start to
		// exit: which goroutine wakes which, for profiles of the daemon's wake-ups.
		Trace string
		// CPUProfile writes a pprof CPU profile (runtime/pprof) to this file from start to
		// exit: where the daemon's CPU per record goes (PERFORMANCE.md, issue 38).
		CPUProfile string
		// MemProfile samples every allocation from start and writes the allocation profile
		// (runtime/pprof "allocs") to this file at exit: what runs the collector per record.
		MemProfile string
	}
}

// cpuBudget is the server's CPU budget: nil (unlimited) for a negative --cpu-budget.
func (c *serveConfig) cpuBudget() *float64 {
	if c.Pipeline.CPUBudget < 0 {
		return nil
	}
	v := c.Pipeline.CPUBudget
	return &v
}

func (c *serveConfig) validate() error {
	switch {
	case c.Memory.Limit < 1<<20:
		return fmt.Errorf("--memory-limit %d: must be at least 1MiB", c.Memory.Limit)
	case c.Pipeline.Workers < 0 || c.Pipeline.Workers > 1024:
		return fmt.Errorf("--workers %d: must be 0 (GOMAXPROCS) to 1024", c.Pipeline.Workers)
	case !(c.Pipeline.CPUBudget <= 1024): // NaN too
		return fmt.Errorf("--cpu-budget %g: must be a number of CPUs up to 1024", c.Pipeline.CPUBudget)
	case c.Pipeline.MaxBlockSize < 4096 || c.Pipeline.MaxBlockSize > 64<<20:
		return fmt.Errorf("--max-block-size %d: must be 4KiB..64MiB", c.Pipeline.MaxBlockSize)
	case c.Limits.MaxSessions < 1:
		return fmt.Errorf("--max-sessions %d: must be at least 1", c.Limits.MaxSessions)
	case c.Limits.MaxRingSize <= shm.HeaderSize:
		return fmt.Errorf("--max-ring-size %d: must exceed the %d-byte ring header", c.Limits.MaxRingSize, shm.HeaderSize)
	case c.Limits.MaxNameLen < 1 || c.Limits.MaxNameLen > shm.MaxNameLen:
		return fmt.Errorf("--max-name-len %d: must be 1..%d", c.Limits.MaxNameLen, shm.MaxNameLen)
	case c.Limits.MaxNDim < 0 || c.Limits.MaxNDim > shm.MaxNDim:
		return fmt.Errorf("--max-ndim %d: must be 0..%d", c.Limits.MaxNDim, shm.MaxNDim)
	case c.Probes.SampleReadWrite < 0:
		return fmt.Errorf("--trace-sample-read-write %d: must not be negative (0 and 1 time every call)", c.Probes.SampleReadWrite)
	case c.Probes.Interval != 0 && c.Probes.Interval < 100*time.Millisecond:
		return fmt.Errorf("--trace-interval %v: must be at least 100ms", c.Probes.Interval)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("--shutdown-timeout %v: must be positive", c.ShutdownTimeout)
	case c.ExitIdle < 0:
		return fmt.Errorf("--exit-idle %v: must be 0 (never) or positive", c.ExitIdle)
	case c.Debug.WriteDelay < 0:
		return fmt.Errorf("--debug-write-delay %v: must not be negative", c.Debug.WriteDelay)
	case c.Clients.MaxConns < 0:
		return fmt.Errorf("--max-conns %d: must be positive (0: the default)", c.Clients.MaxConns)
	case c.Clients.MaxConnsPerUID < 0:
		return fmt.Errorf("--max-conns-per-uid %d: must be positive (0: the default)", c.Clients.MaxConnsPerUID)
	case c.Clients.MaxSessionsPerUID < 0:
		return fmt.Errorf("--max-sessions-per-uid %d: must be positive (0: the default)", c.Clients.MaxSessionsPerUID)
	case c.Clients.ConnectRate < 0:
		return fmt.Errorf("--max-connect-rate %g: must be 0 (unlimited) or positive", c.Clients.ConnectRate)
	case c.Clients.RequestRate < 0:
		return fmt.Errorf("--max-request-rate %g: must be 0 (unlimited) or positive", c.Clients.RequestRate)
	}
	if _, err := c.socketMode(); err != nil {
		return err
	}
	if err := c.Upload.validate(); err != nil {
		return err
	}
	return c.HTTP.validate()
}

// socketMode parses --socket-mode.
func (c *serveConfig) socketMode() (os.FileMode, error) {
	if c.Access.SocketMode == "" {
		return 0o660, nil
	}
	m, err := strconv.ParseUint(c.Access.SocketMode, 8, 32)
	if err != nil || m == 0 || m&^0o777 != 0 || m&0o600 != 0o600 {
		return 0, fmt.Errorf("--socket-mode %q: want octal permission bits that let the owner read and write, e.g. 0660", c.Access.SocketMode)
	}
	return os.FileMode(m), nil
}

// socketGID resolves --socket-group. The default group missing (or not ours to give when
// not root) leaves the socket to its owner alone, with a warning that warn logs (serve logs
// it once the socket is its own: a daemon that lost the start says only that); an explicit
// one is an error.
func (c *serveConfig) socketGID(log *zap.Logger, mode *os.FileMode) (gid int, warn func(), err error) {
	warn = func() {}
	if c.Access.SocketGroup == "" {
		return 0, warn, nil
	}
	gid = -1
	if n, perr := strconv.Atoi(c.Access.SocketGroup); perr == nil && n >= 0 {
		gid = n
	} else if g, lerr := user.LookupGroup(c.Access.SocketGroup); lerr == nil {
		gid, err = strconv.Atoi(g.Gid)
	} else {
		err = lerr
	}
	if err == nil && os.Geteuid() != 0 && gid != os.Getegid() {
		if groups, gerr := os.Getgroups(); gerr != nil || !slices.Contains(groups, gid) {
			err = fmt.Errorf("not root and not a member of group %d", gid)
		}
	}
	if err != nil {
		if c.Access.SocketGroupSet {
			return 0, warn, fmt.Errorf("--socket-group %q: %w", c.Access.SocketGroup, err)
		}
		group, cause := c.Access.SocketGroup, err
		*mode &= 0o700
		return 0, func() {
			log.Warn("socket group unavailable; only the daemon's own uid (and root) can connect",
				zap.String("group", group), zap.Error(cause))
		}, nil
	}
	return gid, warn, nil
}

func toUint32(s []uint) []uint32 {
	var out []uint32
	for _, v := range s {
		out = append(out, uint32(v))
	}
	return out
}

func newServeCmd(logger func() *zap.Logger) *cobra.Command {
	var cfg serveConfig
	cfg.Memory.Limit = byteSize(server.DefaultMemoryLimit())
	cfg.Pipeline.MaxBlockSize = 16 << 20
	cfg.Limits.MaxSessions = 64
	cfg.Limits.MaxRingSize = 1 << 30
	cfg.Limits.MaxNameLen = shm.MaxNameLen
	cfg.Limits.MaxNDim = shm.MaxNDim
	cfg.Limits.MaxElements = 1 << 32
	cfg.ShutdownTimeout = 30 * time.Second
	cfg.Probes.Interval = server.DefaultTraceInterval
	cfg.Access.SocketGroup = "strap"
	cfg.Access.SocketMode = "0660"
	def := server.DefaultConfig().Clients
	cfg.Clients.MaxConns = def.MaxConns
	cfg.Clients.MaxConnsPerUID = def.MaxConnsPerUID
	cfg.Clients.MaxSessionsPerUID = def.MaxSessionsPerUID
	cfg.Clients.ConnectRate = def.ConnectRate
	cfg.Clients.RequestRate = def.RequestRate
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Receive activation tensors from capture clients and stream them to disk",
		Long: `serve listens on the control socket (docs/PROTOCOL.md) and runs one session per
client: records from the client's sealed memfd ring are compressed on all cores and written
to the output file the client passed, in sequence order. SIGINT/SIGTERM drain every
session and exit 0; SIGHUP reopens --log-file. Under systemd (docs/DEPLOY.md) it accepts
the socket strapd.socket passes and reports its state with sd_notify.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Access.SocketGroupSet = cmd.Flags().Changed("socket-group")
			if err := cfg.validate(); err != nil {
				return err
			}
			return runServe(cmd.Context(), cfg, logger())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Socket, "socket", "", "control socket path (default: $STRAPD_SOCKET, /run/strapd/strapd.sock as root, else $XDG_RUNTIME_DIR/strapd/strapd.sock or /tmp/strapd-$UID/strapd.sock)")
	f.Var(&cfg.Memory.Limit, "memory-limit", "memory for ring mappings plus compression buffers in flight, e.g. 512MiB, 4GiB; unset, a quarter of MemTotal or of the cgroup's memory.max when lower (docs/DEPLOY.md)")
	f.IntVar(&cfg.Pipeline.Workers, "workers", 0, "compression workers shared by all sessions (0: one per CPU)")
	f.Var(&cfg.Pipeline.MaxBlockSize, "max-block-size", "largest compression block a client may ask for")
	f.Float64Var(&cfg.Pipeline.CPUBudget, "cpu-budget", -1, "CPUs compression may use, all sessions together, e.g. 0.5; blocks beyond it are stored raw (negative: unlimited)")
	f.IntVar(&cfg.Limits.MaxSessions, "max-sessions", cfg.Limits.MaxSessions, "most sessions open at once")
	f.Var(&cfg.Limits.MaxRingSize, "max-ring-size", "largest ring a client may open")
	f.IntVar(&cfg.Limits.MaxNameLen, "max-name-len", cfg.Limits.MaxNameLen, "longest module name accepted")
	f.IntVar(&cfg.Limits.MaxNDim, "max-ndim", cfg.Limits.MaxNDim, "most tensor dimensions accepted")
	f.Uint64Var(&cfg.Limits.MaxElements, "max-elements", cfg.Limits.MaxElements, "most elements one captured tensor may have (0: no limit)")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "how long SIGTERM waits for sessions to drain")
	f.BoolVar(&cfg.NarrowProcs, "narrow-procs", true, "run the Go runtime on one P (GOMAXPROCS 1) while at most one session is open and no block waits for the compression pool: fewer thread wake-ups per decoding step; every P otherwise (off when GOMAXPROCS is set in the environment; docs/PERFORMANCE.md)")
	f.BoolVar(&cfg.IdleWorkers, "idle-workers", false, "run the compression workers under SCHED_IDLE, so the model's threads preempt them; normal-priority rescuers take jobs they leave waiting over 20ms (docs/DEPLOY.md, CPU priority)")
	f.BoolVar(&cfg.SchedIdle, "sched-idle", false, "run the daemon's threads under SCHED_IDLE: the model's threads preempt its compression on a host whose cores they use (docs/DEPLOY.md, CPU priority)")
	f.DurationVar(&cfg.ExitIdle, "exit-idle", 0, "exit cleanly after this long with no client connected (0: never; the Python client starts strapd with 15m)")
	f.BoolVar(&cfg.Probes.Off, "no-probes", false, "run no eBPF/proc collector: no kernel trace beside captures")
	f.BoolVar(&cfg.Probes.NoBPF, "no-bpf", false, "do not load eBPF probes; the collector uses /proc fallbacks only")
	f.DurationVar(&cfg.Probes.Interval, "trace-interval", cfg.Probes.Interval, "time between kernel snapshots written to session traces")
	f.BoolVar(&cfg.Probes.PerThread, "trace-per-thread", false, "add the per-thread breakdown to trace snapshots")
	f.IntVar(&cfg.Probes.SampleReadWrite, "trace-sample-read-write", 1, "time one read/write syscall in N for the syscall latency histograms (counts stay exact)")
	f.StringVar(&cfg.Access.SocketGroup, "socket-group", cfg.Access.SocketGroup, "group given the control socket; its members may connect (empty: leave as created)")
	f.StringVar(&cfg.Access.SocketMode, "socket-mode", cfg.Access.SocketMode, "control socket permission bits, octal")
	f.UintSliceVar(&cfg.Access.AllowUIDs, "allow-uid", nil, "only these uids (and root) may connect (repeatable; default: anyone the socket lets in)")
	f.UintSliceVar(&cfg.Access.AllowGIDs, "allow-gid", nil, "members of these groups may connect (repeatable)")
	f.IntVar(&cfg.Clients.MaxConns, "max-conns", cfg.Clients.MaxConns, "most connections open at once")
	f.IntVar(&cfg.Clients.MaxConnsPerUID, "max-conns-per-uid", cfg.Clients.MaxConnsPerUID, "most connections one uid may hold")
	f.IntVar(&cfg.Clients.MaxSessionsPerUID, "max-sessions-per-uid", cfg.Clients.MaxSessionsPerUID, "most sessions one uid may hold")
	f.Float64Var(&cfg.Clients.ConnectRate, "max-connect-rate", cfg.Clients.ConnectRate, "new connections per second per uid (0: unlimited)")
	f.Float64Var(&cfg.Clients.RequestRate, "max-request-rate", cfg.Clients.RequestRate, "control messages per second per connection (0: unlimited)")
	f.StringVar(&cfg.LogFile, "log-file", "", "write the log here (JSON lines) instead of stderr; SIGHUP reopens it")
	f.StringVar(&cfg.HTTP.Addr, "http", "", "serve Prometheus /metrics on this host:port (e.g. 127.0.0.1:9464) and the JSON API on --http-api-socket; off when empty")
	f.StringVar(&cfg.HTTP.APISocket, "http-api-socket", "", "Unix socket of the JSON API, with the control socket's mode, group and allow-lists (default: api.sock beside the control socket)")
	f.BoolVar(&cfg.HTTP.MetricsDetail, "http-metrics-detail", false, "add per-session series (session id, uid, pid) to /metrics")
	f.IntVar(&cfg.HTTP.MaxFollowers, "http-max-followers", httpapi.DefaultMaxFollowers, "resource-log streams (follow=1) open at once; more get 429")
	addUploadFlags(f, &cfg.Upload)
	f.DurationVar(&cfg.Debug.WriteDelay, "debug-write-delay", 0, "sleep after every packet written (tests only)")
	_ = f.MarkHidden("debug-write-delay")
	f.StringVar(&cfg.Debug.Trace, "debug-trace", "", "write a Go execution trace (go tool trace) to this file until exit (profiling only)")
	_ = f.MarkHidden("debug-trace")
	f.StringVar(&cfg.Debug.CPUProfile, "debug-cpuprofile", "", "write a pprof CPU profile (go tool pprof) to this file until exit (profiling only)")
	_ = f.MarkHidden("debug-cpuprofile")
	f.StringVar(&cfg.Debug.MemProfile, "debug-memprofile", "", "sample every allocation and write the allocation profile (go tool pprof) to this file at exit (profiling only)")
	_ = f.MarkHidden("debug-memprofile")
	return cmd
}

// byteSize is a flag value in bytes that accepts binary and decimal suffixes: 4096, 64KiB,
// 512MiB, 1GiB, 1G (= GiB), 10MB.
type byteSize int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

func parseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if len(t) > len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(t[:len(t)-len(u.suffix)])
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a non-negative integer with an optional unit (KiB, MiB, GiB, KB, MB, GB)", s)
	}
	if n > 0 && mult > (1<<62)/n {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n * mult, nil
}

// String formats the size with the largest exact binary unit.
func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// Set parses a size.
func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// Type names the flag's value type in help.
func (b *byteSize) Type() string { return "bytes" }

// orOff maps the flag's "0: unlimited" to the server's "negative: off".
func orOff(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// runServe runs the daemon until ctx is done or SIGINT/SIGTERM, then drains. base is the
// root logger, without a component: each part adds its own (strapd for these lines,
// server, session, probes, http), so no line carries the key twice.
func runServe(ctx context.Context, cfg serveConfig, base *zap.Logger) error {
	notify := func(state string) {
		if err := server.Notify(state); err != nil {
			fmt.Fprintln(os.Stderr, "strapd: sd_notify:", err)
		}
	}
	notify("STATUS=starting")
	var logFile *server.LogFile
	if cfg.LogFile != "" {
		var err error
		if logFile, err = server.OpenLogFile(cfg.LogFile); err != nil {
			return err
		}
		defer logFile.Close()
		base = fileLogger(logFile, base)
	}
	log := base.With(zap.String("component", "strapd"))
	defer log.Sync() //nolint:errcheck // stderr sync errors are not actionable
	if cfg.SchedIdle {
		if err := schedIdle(); err != nil {
			return err
		}
	}
	if cfg.Debug.Trace != "" {
		stopTrace, err := startTrace(cfg.Debug.Trace)
		if err != nil {
			return err
		}
		defer stopTrace()
	}
	if cfg.Debug.CPUProfile != "" {
		stopProfile, err := startCPUProfile(cfg.Debug.CPUProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	if cfg.Debug.MemProfile != "" {
		stopMem, err := startMemProfile(cfg.Debug.MemProfile)
		if err != nil {
			return err
		}
		defer stopMem()
	}
	// SIGTERM/SIGINT cancel ctx (drain, then exit); SIGHUP only reopens the log.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	defer reopenOnHUP(logFile, cfg.LogFile, log)()

	mode, _ := cfg.socketMode()
	notify("STATUS=opening control socket")
	ln, err := server.ActivationListener()
	if err != nil {
		return err
	}
	gid := 0
	warnGroup := func() {}
	if ln == nil {
		if gid, warnGroup, err = cfg.socketGID(log, &mode); err != nil {
			return err
		}
	}
	var srv *server.Server
	var obs *observer
	var observe server.Observer // stays a nil interface without --http
	if cfg.HTTP.Addr != "" {
		obs = newObserver(cfg.HTTP, !cfg.Probes.Off, &srv)
		observe = obs
	}
	notify("STATUS=loading object storage configuration")
	upm, uploads, err := cfg.Upload.manager(ctx, base)
	if err != nil {
		notify("STATUS=failed: " + err.Error())
		return err
	}
	// Uploads still going when serve ends get the shutdown timeout to complete.
	defer drainUploads(upm, cfg.ShutdownTimeout, log)
	scfg := cfg.serverConfig(mode, gid, notify, observe)
	scfg.Uploads = uploads
	srv = server.New(scfg, base)
	if ln != nil {
		srv.UseListener(ln)
	} else if err := srv.Listen(); err != nil {
		if live, ok := errors.AsType[*server.AlreadyRunningError](err); ok {
			// Lost the start to another daemon (clients autostarting at once, PROTOCOL.md
			// 1): not a failure, the clients connect to the winner.
			fields := []zap.Field{zap.String("socket", live.Socket)}
			if live.PID > 0 {
				fields = append(fields, zap.Int("pid", live.PID))
			}
			log.Info("another strapd serves on this socket; exiting", fields...)
			return nil
		}
		notify("STATUS=failed: " + err.Error())
		return err
	}
	warnGroup()
	resumePending(upm, log)
	if obs != nil {
		if ln != nil { // socket-activated: the API socket still needs its group
			if gid, warnGroup, err = cfg.socketGID(log, &mode); err != nil {
				return err
			}
			warnGroup()
		}
		// HTTP outlives the signal: /metrics and the API answer while sessions drain.
		hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
		wait, err := startHTTP(hctx, cfg.HTTP, srv, obs, mode, gid, base)
		if err != nil {
			hcancel()
			notify("STATUS=failed: " + err.Error())
			return err
		}
		defer wait()
		defer hcancel()
	}
	err = srv.Serve(ctx)
	if errors.Is(err, server.ErrDrainTimeout) {
		log.Error("exiting with sessions unfinished", zap.Error(err))
	}
	return err
}

// fileLogger writes base's lines as JSON to the --log-file (instead of stderr).
func fileLogger(f *server.LogFile, base *zap.Logger) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = "ts"
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(ec), f, base.Core()))
}

// reopenOnHUP reopens the --log-file on each SIGHUP (logrotate moved it away) until the
// returned function is called.
func reopenOnHUP(f *server.LogFile, path string, log *zap.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range hup {
			if f == nil {
				log.Info("SIGHUP: no --log-file to reopen (logging to stderr)")
				continue
			}
			if err := f.Reopen(); err != nil {
				log.Error("SIGHUP: reopen log file", zap.Error(err))
				continue
			}
			log.Info("SIGHUP: log file reopened", zap.String("path", path))
		}
	}()
	return func() {
		signal.Stop(hup)
		close(hup)
		<-done
	}
}

// serverConfig is the server's part of the command line, with the control socket's mode
// and group as resolved.
func (c *serveConfig) serverConfig(mode os.FileMode, gid int, notify func(string), observe server.Observer) server.Config {
	return server.Config{
		Socket:          control.DaemonSocketPath(c.Socket),
		MemoryLimit:     int64(c.Memory.Limit),
		Workers:         c.Pipeline.Workers,
		IdleWorkers:     c.IdleWorkers,
		NarrowProcs:     c.NarrowProcs,
		MaxSessions:     c.Limits.MaxSessions,
		MaxRingSize:     uint64(c.Limits.MaxRingSize),
		MaxBlockSize:    uint64(c.Pipeline.MaxBlockSize),
		Limits:          shm.Limits{MaxNDim: c.Limits.MaxNDim, MaxNameLen: c.Limits.MaxNameLen, MaxElements: c.Limits.MaxElements},
		DebugWriteDelay: c.Debug.WriteDelay,
		CPUBudget:       c.cpuBudget(),
		ShutdownTimeout: c.ShutdownTimeout,
		ExitIdle:        c.ExitIdle,
		Version:         version,
		Access: server.Access{SocketMode: mode, SocketGID: gid,
			AllowUIDs: toUint32(c.Access.AllowUIDs), AllowGIDs: toUint32(c.Access.AllowGIDs)},
		Clients: server.ClientLimits{MaxConns: c.Clients.MaxConns, MaxConnsPerUID: c.Clients.MaxConnsPerUID,
			MaxSessionsPerUID: c.Clients.MaxSessionsPerUID, ConnectRate: orOff(c.Clients.ConnectRate),
			RequestRate: orOff(c.Clients.RequestRate)},
		Notify: notify,
		Probes: server.Probes{Enabled: !c.Probes.Off, NoBPF: c.Probes.NoBPF,
			Interval: c.Probes.Interval, PerThread: c.Probes.PerThread, SampleReadWrite: c.Probes.SampleReadWrite},
		Observer: observe,
	}
}

// startTrace starts a Go execution trace into path (--debug-trace); the returned function
// stops it and closes the file.
func startTrace(path string) (func(), error) {
	return startDebugFile("--debug-trace", path, trace.Start, trace.Stop)
}

// startCPUProfile starts a pprof CPU profile into path (--debug-cpuprofile); the returned
// function stops it and closes the file. SIGTERM drains and returns through it, so a
// daemon stopped the usual way leaves a complete profile.
func startCPUProfile(path string) (func(), error) {
	return startDebugFile("--debug-cpuprofile", path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// startMemProfile samples every allocation from now on (--debug-memprofile); the returned
// function writes the allocation profile into path and closes it.
func startMemProfile(path string) (func(), error) {
	var out io.Writer
	stop, err := startDebugFile("--debug-memprofile", path, func(w io.Writer) error {
		out = w
		runtime.MemProfileRate = 1
		return nil
	}, func() {
		runtime.GC() // the profile counts allocations up to the last collection
		if err := pprof.Lookup("allocs").WriteTo(out, 0); err != nil {
			fmt.Fprintf(os.Stderr, "strapd: --debug-memprofile: %v\n", err)
		}
	})
	return stop, err
}

// startDebugFile creates path and starts writing a runtime recording into it (start); the
// returned function stops the recording (stop) and closes the file. Errors name flag.
func startDebugFile(flag, path string, start func(io.Writer) error, stop func()) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return func() {
		stop()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "strapd: %s: %v\n", flag, err)
		}
	}, nil
}
