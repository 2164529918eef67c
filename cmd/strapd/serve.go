package main

import (
	"fmt"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/server"
	"github.com/strap-llm/strap/internal/shm"
)

// serveConfig is everything `strapd serve` is told on its command line.
type serveConfig struct {
	// Socket is the control socket path; empty resolves per PROTOCOL.md 1.
	Socket string
	// Memory bounds what the daemon may hold.
	Memory struct {
		// Limit counts ring mappings plus compression buffers in flight.
		Limit byteSize
	}
	// Pipeline sizes the compression pool.
	Pipeline struct {
		// Workers is the number of compression goroutines; 0 means GOMAXPROCS.
		Workers int
		// MaxBlockSize is the largest block_size a client may ask for.
		MaxBlockSize byteSize
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
	}
	// ShutdownTimeout bounds how long SIGTERM waits for sessions to drain.
	ShutdownTimeout time.Duration
	// Debug holds hidden test options.
	Debug struct {
		// WriteDelay sleeps this long after every packet written (tests fill tiny rings).
		WriteDelay time.Duration
	}
}

func (c *serveConfig) validate() error {
	switch {
	case c.Memory.Limit < 1<<20:
		return fmt.Errorf("--memory-limit %d: must be at least 1MiB", c.Memory.Limit)
	case c.Pipeline.Workers < 0 || c.Pipeline.Workers > 1024:
		return fmt.Errorf("--workers %d: must be 0 (GOMAXPROCS) to 1024", c.Pipeline.Workers)
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
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("--shutdown-timeout %v: must be positive", c.ShutdownTimeout)
	case c.Debug.WriteDelay < 0:
		return fmt.Errorf("--debug-write-delay %v: must not be negative", c.Debug.WriteDelay)
	}
	return nil
}

func newServeCmd(logger func() *zap.Logger) *cobra.Command {
	var cfg serveConfig
	cfg.Memory.Limit = 4 << 30
	cfg.Pipeline.MaxBlockSize = 16 << 20
	cfg.Limits.MaxSessions = 64
	cfg.Limits.MaxRingSize = 1 << 30
	cfg.Limits.MaxNameLen = shm.MaxNameLen
	cfg.Limits.MaxNDim = shm.MaxNDim
	cfg.ShutdownTimeout = 30 * time.Second
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Receive activation tensors from capture clients and stream them to disk",
		Long: `serve listens on the control socket (docs/PROTOCOL.md) and runs one session per
client: records from the client's sealed memfd ring are compressed on all cores and written
to the output file the client passed, in sequence order. SIGINT/SIGTERM drain every
session and exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.validate(); err != nil {
				return err
			}
			log := logger().With(zap.String("component", "strapd"))
			defer log.Sync() //nolint:errcheck // stderr sync errors are not actionable
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			srv := server.New(server.Config{
				Socket:          control.DaemonSocketPath(cfg.Socket),
				MemoryLimit:     int64(cfg.Memory.Limit),
				Workers:         cfg.Pipeline.Workers,
				MaxSessions:     cfg.Limits.MaxSessions,
				MaxRingSize:     uint64(cfg.Limits.MaxRingSize),
				MaxBlockSize:    uint64(cfg.Pipeline.MaxBlockSize),
				Limits:          shm.Limits{MaxNDim: cfg.Limits.MaxNDim, MaxNameLen: cfg.Limits.MaxNameLen},
				DebugWriteDelay: cfg.Debug.WriteDelay,
				ShutdownTimeout: cfg.ShutdownTimeout,
				Version:         version,
			}, log)
			if err := srv.Listen(); err != nil {
				return err
			}
			return srv.Serve(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Socket, "socket", "", "control socket path (default: $STRAPD_SOCKET, /run/strapd/strapd.sock as root, else $XDG_RUNTIME_DIR/strapd/strapd.sock or /tmp/strapd-$UID/strapd.sock)")
	f.Var(&cfg.Memory.Limit, "memory-limit", "memory for ring mappings plus compression buffers in flight (e.g. 512MiB, 4GiB)")
	f.IntVar(&cfg.Pipeline.Workers, "workers", 0, "compression workers shared by all sessions (0: one per CPU)")
	f.Var(&cfg.Pipeline.MaxBlockSize, "max-block-size", "largest compression block a client may ask for")
	f.IntVar(&cfg.Limits.MaxSessions, "max-sessions", cfg.Limits.MaxSessions, "most sessions open at once")
	f.Var(&cfg.Limits.MaxRingSize, "max-ring-size", "largest ring a client may open")
	f.IntVar(&cfg.Limits.MaxNameLen, "max-name-len", cfg.Limits.MaxNameLen, "longest module name accepted")
	f.IntVar(&cfg.Limits.MaxNDim, "max-ndim", cfg.Limits.MaxNDim, "most tensor dimensions accepted")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "how long SIGTERM waits for sessions to drain")
	f.DurationVar(&cfg.Debug.WriteDelay, "debug-write-delay", 0, "sleep after every packet written (tests only)")
	_ = f.MarkHidden("debug-write-delay")
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
