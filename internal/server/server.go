package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/trace"
)

// Errors returned by this package.
var (
	// ErrAlreadyRunning: another daemon answers on the socket path (Listen returns it
	// as an *AlreadyRunningError).
	ErrAlreadyRunning = errors.New("another strapd is serving on this socket")
	// ErrNotSocket: the socket path exists and is not a socket, so it is not removed.
	ErrNotSocket = errors.New("socket path exists and is not a socket")
	// errQueueFull: a client left too many replies unread.
	errQueueFull = errors.New("client does not read its replies")
	// ErrDrainTimeout: shutdown gave up on sessions still draining after ShutdownTimeout.
	ErrDrainTimeout = errors.New("sessions still draining at the shutdown timeout")
)

// goHeapSlack is how far above the memory limit less the open rings the Go heap may grow
// (pipeline.Budget.LimitGoHeap): codec state and the runtime's own memory, which the budget
// does not count, with the process's RSS kept under the limit + 64 MiB.
const goHeapSlack = 40 << 20

// Config are the server's settings. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Socket is the resolved control socket path.
	Socket string
	// MemoryLimit bounds ring mappings plus compression buffers in flight, in bytes
	// (0: DefaultMemoryLimit, a quarter of the host's memory).
	MemoryLimit int64
	// Workers sizes the compression pool (GOMAXPROCS when 0).
	Workers int
	// IdleWorkers runs the compression workers under SCHED_IDLE, with a normal-priority
	// rescuer for jobs they are too starved to start (pipeline.Pool).
	IdleWorkers bool
	// NarrowProcs runs the Go runtime on one P while at most one session is open and the
	// pool is idle (pipeline.PoolOptions.NarrowProcs); off when GOMAXPROCS is set in the
	// environment, which is then the user's choice.
	NarrowProcs bool
	// MaxSessions is the most sessions open at once.
	MaxSessions int
	// MaxRingSize is the largest ring a client may open, in bytes.
	MaxRingSize uint64
	// MaxBlockSize is the largest block_size a client may ask for.
	MaxBlockSize uint64
	// Limits bound record names, meta and dimensions.
	Limits shm.Limits
	// DebugWriteDelay slows every packet write (tests fill tiny rings with it).
	DebugWriteDelay time.Duration
	// ShutdownTimeout bounds how long shutdown waits for sessions to drain.
	ShutdownTimeout time.Duration
	// HandshakeTimeout bounds how long a new connection may take to send HELLO.
	HandshakeTimeout time.Duration
	// ExitIdle, when positive, ends Serve cleanly once no control connection has been open
	// for this long (a daemon the client started for itself does not linger forever).
	ExitIdle time.Duration
	// Version is the daemon version reported in WELCOME and STATUS.
	Version string
	// Access sets the socket's mode and group and the uid/gid allow-lists.
	Access Access
	// Clients bounds connections, sessions and request rates per client and per uid.
	Clients ClientLimits
	// Notify receives service state changes for systemd (READY=1, STATUS=…, STOPPING=1);
	// nil: none are sent. It must not block for long.
	Notify func(state string)
	// Probes runs the eBPF collector beside the captures (probes.go); zero: none.
	Probes Probes
	// Observer receives timings, ended sessions and kernel snapshots for metrics
	// (internal/metrics); nil: none.
	Observer Observer
	// CPUBudget bounds the CPUs compression may use, all sessions together; blocks beyond
	// it are stored raw (pipeline.CPUBudget). nil: unlimited.
	CPUBudget *float64
	// Uploads configures uploads to object storage (upload.go); zero: none.
	Uploads Uploads
}

// Observer is what the server tells metrics. Its methods must return quickly.
type Observer interface {
	pipeline.Observer
	// SessionEnded is a session's final status, once, after it finished.
	SessionEnded(control.SessionStatus)
	// ObserveSnapshot is each kernel snapshot the probe ticker takes.
	ObserveSnapshot(trace.Snapshot)
	// ObserveResources is the JSON lines of resource events just appended to a
	// session's resource log (after the append, failed or not: they were sent).
	ObserveResources(lines []byte)
}

// PoolLoad reports the compression pool's size, busy workers, queued jobs and each
// worker's cumulative seconds in jobs (zeros before Serve started the pool).
func (s *Server) PoolLoad() (workers, busy, queued int, busySeconds []float64) {
	if s.pool == nil {
		return 0, 0, 0, nil
	}
	busy, queued, busySeconds = s.pool.Load()
	return s.pool.Workers(), busy, queued, busySeconds
}

// PoolIdle reports whether the compression workers run under SCHED_IDLE, and the jobs the
// pool's normal-priority rescuer ran because they were starved.
func (s *Server) PoolIdle() (idle bool, rescued uint64) {
	if s.pool == nil {
		return false, 0
	}
	idle, _ = s.pool.Idle()
	return idle, s.pool.Rescued()
}

// DefaultConfig returns safe defaults (socket path left empty).
func DefaultConfig() Config {
	return Config{
		MemoryLimit:      DefaultMemoryLimit(),
		MaxSessions:      64,
		MaxRingSize:      1 << 30,
		MaxBlockSize:     16 << 20,
		ShutdownTimeout:  30 * time.Second,
		HandshakeTimeout: 10 * time.Second,
		Version:          "0.0.0",
		Access:           Access{SocketMode: 0o600},
		Clients: ClientLimits{MaxConns: 1024, MaxConnsPerUID: 128, MaxSessionsPerUID: 32,
			ConnectRate: 200, RequestRate: 200000},
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	if c.MemoryLimit == 0 {
		c.MemoryLimit = d.MemoryLimit
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = d.MaxSessions
	}
	if c.MaxRingSize == 0 {
		c.MaxRingSize = d.MaxRingSize
	}
	if c.MaxBlockSize == 0 {
		c.MaxBlockSize = d.MaxBlockSize
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = d.ShutdownTimeout
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.Version == "" {
		c.Version = d.Version
	}
	if c.Access.SocketMode == 0 {
		c.Access.SocketMode = d.Access.SocketMode
	}
	for _, f := range []struct {
		v   *int
		def int
	}{{&c.Clients.MaxConns, d.Clients.MaxConns}, {&c.Clients.MaxConnsPerUID, d.Clients.MaxConnsPerUID},
		{&c.Clients.MaxSessionsPerUID, d.Clients.MaxSessionsPerUID}} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.Clients.ConnectRate == 0 {
		c.Clients.ConnectRate = d.Clients.ConnectRate
	}
	if c.Clients.RequestRate == 0 {
		c.Clients.RequestRate = d.Clients.RequestRate
	}
}

// Server is the daemon's control-socket server.
type Server struct {
	cfg  Config
	root *zap.Logger // New's logger, without a component: parts add theirs to it
	log  *zap.Logger // the server's own lines (component "server")
	ln   *net.UnixListener
	// sockFile is the socket file Listen bound (nil for a listener from UseListener).
	sockFile os.FileInfo
	pool     *pipeline.Pool
	budget   *pipeline.Budget
	cpu      *pipeline.CPUBudget // nil: unlimited
	started  time.Time

	mu        sync.Mutex
	conns     map[*conn]struct{}
	idleSince time.Time // when the last connection closed; zero while one is open
	// idleKick wakes idleExpired's goroutine, parked while connections are open, when the
	// last one closes (buffered, never blocks the sender).
	idleKick  chan struct{}
	sessions  int
	outputs   map[fileID]outputHolder // the output file of every live session (claimOutput)
	nextID    uint64
	closing   atomic.Bool
	wg        sync.WaitGroup
	quotas    quotas
	refusing  atomic.Int32 // refused connections being answered (refuse)
	inherited bool         // the listener came from systemd (UseListener)
	probes    *probeHub    // nil without Config.Probes.Enabled
}

// New creates a server; Listen (or UseListener) and Serve start it. log carries no
// "component" field: the server adds one per part (server for its own lines, session,
// probes), so no line names two.
func New(cfg Config, log *zap.Logger) *Server {
	cfg.fill()
	if log == nil {
		log = zap.NewNop()
	}
	return &Server{cfg: cfg, root: log, log: log.With(zap.String("component", "server")), conns: map[*conn]struct{}{},
		outputs: map[fileID]outputHolder{}, started: time.Now(), idleSince: time.Now(), idleKick: make(chan struct{}, 1)}
}

// Listen creates the socket: parent directory with mode 0700 (0750 and the socket group
// when Access.SocketGID is positive) when it does not exist, a stale socket removed,
// ErrAlreadyRunning when another daemon answers, then the socket's mode and group from
// Access.
func (s *Server) Listen() error {
	path := s.cfg.Socket
	if path == "" {
		return errors.New("listen: no socket path")
	}
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		mode := os.FileMode(0o700)
		if s.cfg.Access.SocketGID > 0 {
			mode = 0o750
		}
		if err := os.MkdirAll(dir, mode); err != nil {
			return fmt.Errorf("create socket dir: %w", err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("create socket dir: %w", err)
		}
		if s.cfg.Access.SocketGID > 0 {
			if err := os.Chown(dir, -1, s.cfg.Access.SocketGID); err != nil {
				return fmt.Errorf("create socket dir: %w", err)
			}
		}
	}
	defer lockSocketDir(dir, s.log)()
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("listen %s: %w", path, ErrNotSocket)
		}
		live, err := answering(path)
		if live != nil {
			return live
		}
		s.log.Info("removing stale socket", zap.String("socket", path), zap.Error(err))
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove stale socket: %w", err)
		}
	}
	// bind creates the socket file with 0777 &^ umask: no client may get in before the
	// chmod below, so bind under a umask that leaves only the owner.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	unix.Umask(old)
	if errors.Is(err, unix.EADDRINUSE) {
		// Another daemon bound the path since the check above (two started at once); it
		// listens a moment after its bind.
		for range 50 {
			if live, _ := answering(path); live != nil {
				return live
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// The socket file is removed by unlinkSocket, only while it is still this one: a daemon
	// exiting idle must not remove the socket of one that took the path since.
	ln.SetUnlinkOnClose(false)
	if err := s.applySocketPerms(path); err != nil {
		ln.Close()
		os.Remove(path)
		return fmt.Errorf("listen: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		s.sockFile = fi
	}
	s.ln = ln
	return nil
}

// unlinkSocket removes the socket file Listen bound, under the socket directory's lock and
// only when the path still names that file: a daemon started since (autostarted the
// moment this one stopped accepting) may have taken the path over as stale and bound its
// own.
func (s *Server) unlinkSocket() {
	if s.sockFile == nil {
		return
	}
	path := s.cfg.Socket
	defer lockSocketDir(filepath.Dir(path), s.log)()
	if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, s.sockFile) {
		os.Remove(path)
	}
}

// AlreadyRunningError is Listen's error when another daemon answers on the socket; it
// unwraps to ErrAlreadyRunning. Two daemons started at once by autostarting clients end
// here, and the loser is expected to leave quietly (PROTOCOL.md 1).
type AlreadyRunningError struct {
	// Socket is the path the other daemon serves.
	Socket string
	// PID is the other daemon's process id (SO_PEERCRED), 0 when the kernel did not say
	// (another PID namespace).
	PID int
}

func (e *AlreadyRunningError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("listen %s: %v (pid %d)", e.Socket, ErrAlreadyRunning, e.PID)
	}
	return fmt.Sprintf("listen %s: %v", e.Socket, ErrAlreadyRunning)
}

func (e *AlreadyRunningError) Unwrap() error { return ErrAlreadyRunning }

// answering dials path and returns the daemon found there, or nil and the dial's error
// when nobody accepts.
func answering(path string) (*AlreadyRunningError, error) {
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	found := &AlreadyRunningError{Socket: path}
	if rc, err := c.(*net.UnixConn).SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				found.PID = int(cred.Pid)
			}
		})
	}
	return found, nil
}

// lockSocketDir makes daemons started at once take turns from the stale-socket check to
// the listen: otherwise one could take the other's socket, bound but not yet listening,
// for stale and remove it, leaving that daemon serving an unreachable socket. The lock is
// a flock on the directory itself, not the clients' strapd.sock.lock, which an
// autostarting client holds until this daemon accepts (PROTOCOL.md 1). Held only for
// milliseconds; after 5 s without it Listen goes on unlocked, with a warning.
func lockSocketDir(dir string, log *zap.Logger) (unlock func()) {
	d, err := os.Open(dir)
	if err != nil {
		log.Warn("socket directory not locked while binding", zap.String("dir", dir), zap.Error(err))
		return func() {}
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		err = unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		log.Warn("socket directory not locked while binding", zap.String("dir", dir), zap.Error(err))
	}
	return func() { d.Close() }
}

// Socket is the socket path.
func (s *Server) Socket() string { return s.cfg.Socket }

// Serve accepts connections until ctx is cancelled, then drains every session (bounded by
// ShutdownTimeout) and returns. A cancelled context is a clean exit (nil).
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	s.pool = pipeline.NewPoolWith(pipeline.PoolOptions{Workers: s.cfg.Workers, LockThreads: s.cfg.CPUBudget != nil,
		IdleWorkers: s.cfg.IdleWorkers, NarrowProcs: s.cfg.NarrowProcs && os.Getenv("GOMAXPROCS") == ""})
	if idle, err := s.pool.Idle(); err != nil {
		s.log.Warn("compression workers stay at normal priority: SCHED_IDLE refused", zap.Error(err))
	} else if idle {
		s.log.Info("compression workers run under SCHED_IDLE", zap.Duration("rescue_after", pipeline.DefaultRescueAfter))
	}
	s.budget = pipeline.NewBudget(s.cfg.MemoryLimit)
	if s.cfg.CPUBudget != nil {
		s.cpu = pipeline.NewCPUBudget(*s.cfg.CPUBudget)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		s.budget.LimitGoHeap(goHeapSlack)
	}
	s.startProbes()
	s.log.Info("serving", zap.String("socket", s.cfg.Socket), zap.Bool("socket_activated", s.inherited),
		zap.Int("workers", s.pool.Workers()), zap.Int64("memory_limit", s.cfg.MemoryLimit),
		zap.Int("max_sessions", s.cfg.MaxSessions))

	acceptErr := make(chan error, 1)
	go func() {
		for {
			uc, err := s.ln.AcceptUnix()
			if err != nil {
				acceptErr <- err
				return
			}
			c := s.newConn(uc)
			if c == nil {
				continue
			}
			s.wg.Add(1)
			go c.serve()
		}
	}()

	s.notify(fmt.Sprintf("READY=1\nSTATUS=serving on %s", s.cfg.Socket))

	var err error
	select {
	case <-ctx.Done():
	case <-s.idleExpired(ctx):
		s.log.Info("exiting: no connection for the idle time", zap.Duration("exit_idle", s.cfg.ExitIdle))
	case err = <-acceptErr:
		err = fmt.Errorf("accept: %w", err)
		s.log.Error("accept failed", zap.Error(err))
	}
	err = errors.Join(err, s.shutdown())
	if perr := s.stopProbes(); perr != nil {
		s.log.Warn("closing probes", zap.Error(perr))
	}
	return err
}

// idleExpired is closed once ExitIdle has passed with no connection open; nil (never
// ready) when ExitIdle is not set. A connection counts once it was accepted: one made in
// the instant the listener closes is reset and its client must connect again (the Python
// client then starts a new daemon).
func (s *Server) idleExpired(ctx context.Context) <-chan struct{} {
	if s.cfg.ExitIdle <= 0 {
		return nil
	}
	ch := make(chan struct{})
	go func() {
		period := min(s.cfg.ExitIdle/4, time.Second)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.idleKick: // the ticker runs already
			case now := <-t.C:
				if s.connected() {
					// Nothing to check until the last connection closes: no wake-up per
					// second beside a capture (issue 38's wake-ups per token).
					t.Stop()
					select {
					case <-ctx.Done():
						return
					case <-s.idleKick:
					}
					t.Reset(period)
					continue
				}
				busy := s.uploadsBusy()
				s.mu.Lock()
				if busy && !s.idleSince.IsZero() {
					// An upload still sending keeps the daemon; one only retrying does not
					// (the next daemon goes on from its state file).
					s.idleSince = now
				}
				idle := len(s.conns) == 0 && s.sessions == 0 && !s.idleSince.IsZero() &&
					now.Sub(s.idleSince) >= s.cfg.ExitIdle
				s.mu.Unlock()
				if idle {
					close(ch)
					return
				}
			}
		}
	}()
	return ch
}

// connected reports whether a control connection is open.
func (s *Server) connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) > 0
}

// shutdown stops accepting, wakes every connection so it drains its session (every
// published record written, END, index, footer, fdatasync), and waits up to
// ShutdownTimeout; ErrDrainTimeout when sessions were still draining then.
func (s *Server) shutdown() error {
	s.closing.Store(true)
	s.ln.Close()
	s.unlinkSocket()
	s.mu.Lock()
	n := len(s.conns)
	sessions := s.sessions
	for c := range s.conns {
		c.wake()
	}
	s.mu.Unlock()
	s.notify(fmt.Sprintf("STOPPING=1\nSTATUS=draining %d sessions", sessions))
	s.log.Info("shutting down", zap.Int("connections", n), zap.Int("sessions", sessions),
		zap.Duration("timeout", s.cfg.ShutdownTimeout))
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.pool.Close()
		s.log.Info("shutdown complete")
		return nil
	case <-time.After(s.cfg.ShutdownTimeout):
		s.mu.Lock()
		left := s.sessions
		s.mu.Unlock()
		s.log.Error("shutdown timed out; sessions still draining are left unfinished",
			zap.Duration("timeout", s.cfg.ShutdownTimeout), zap.Int("sessions", left))
		return fmt.Errorf("shutdown: %w (%d left after %v)", ErrDrainTimeout, left, s.cfg.ShutdownTimeout)
	}
}

func (s *Server) newConn(uc *net.UnixConn) *conn {
	c := &conn{srv: s, c: control.NewConn(uc)}
	log := s.root.With(zap.String("component", "session"))
	cred, err := c.c.PeerCred()
	if err != nil {
		// Without credentials neither the allow-lists nor per-uid limits can hold: refuse.
		s.refuse(uc, log, CodeAccessDenied, fmt.Errorf("%w: %w", errAccessDenied, err))
		return nil
	}
	c.cred = *cred
	log = log.With(zap.Int32("pid", cred.Pid), zap.Uint32("uid", cred.Uid), zap.Uint32("gid", cred.Gid))
	c.log = log
	if err := s.quotas.connect(s.cfg.Clients, c.cred.Uid, time.Now()); err != nil {
		s.refuse(uc, log, control.CodeLimit, err)
		return nil
	}
	c.counted = true
	c.rate = newRequestLimiter(s.cfg.Clients.RequestRate)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		s.quotas.disconnect(c.cred.Uid, time.Now())
		uc.Close()
		return nil
	}
	s.conns[c] = struct{}{}
	s.idleSince = time.Time{}
	return c
}

func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if len(s.conns) == 0 {
		s.idleSince = time.Now()
		select {
		case s.idleKick <- struct{}{}:
		default: // one is pending
		}
	}
	s.mu.Unlock()
	if c.counted {
		s.quotas.disconnect(c.cred.Uid, time.Now())
	}
}

// takeSessionSlot counts a new session against MaxSessions.
func (s *Server) takeSessionSlot() (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions >= s.cfg.MaxSessions {
		return 0, false
	}
	s.sessions++
	s.nextID++
	return s.nextID, true
}

// fileID names a file whatever the path or descriptor it was reached by.
type fileID struct{ dev, ino uint64 }

// outputHolder is the live session writing a file, as a refused OPEN names it.
type outputHolder struct {
	session uint64
	pid     int32
	path    string // the holder's output_path label
}

// claimOutput makes fd's file the output of session id for as long as it lives: two
// sessions writing one file would interleave or overwrite each other's streams, and a client
// lock alone does not prevent it (a client that takes none, a path reached through a hard
// link). It fails with output_in_use, naming the live session, when another holds the file.
// The claim is made before anything is written to the file.
func (s *Server) claimOutput(fd int, h outputHolder) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, perr(control.CodeBadOutput, "fstat output: %v", err)
	}
	id := fileID{dev: st.Dev, ino: st.Ino}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, busy := s.outputs[id]; busy {
		return fileID{}, perr(control.CodeOutputInUse,
			"output file %q (device %d, inode %d) is already the output of live session %d (client pid %d, output_path %q): two sessions never write one file; use another output path, or wait for that session to end",
			h.path, id.dev, id.ino, old.session, old.pid, old.path)
	}
	s.outputs[id] = h
	return id, nil
}

// releaseOutput ends session's claim on its output file (claimOutput).
func (s *Server) releaseOutput(id fileID, session uint64) {
	s.mu.Lock()
	if h, ok := s.outputs[id]; ok && h.session == session {
		delete(s.outputs, id)
	}
	s.mu.Unlock()
}

func (s *Server) dropSessionSlot() {
	s.mu.Lock()
	s.sessions--
	s.mu.Unlock()
}

// Status builds a STATUS_REPLY.
func (s *Server) Status() control.StatusReply {
	s.mu.Lock()
	var sess []control.SessionStatus
	for c := range s.conns {
		if st, ok := c.status(); ok {
			sess = append(sess, st)
		}
	}
	n := s.sessions
	s.mu.Unlock()
	sort.Slice(sess, func(i, j int) bool { return sess[i].Session < sess[j].Session })
	var used int64
	if s.budget != nil {
		used = s.budget.Used()
	}
	upd, ups := s.uploadStatus()
	return control.StatusReply{
		Daemon: control.DaemonStatus{Version: s.cfg.Version, PID: os.Getpid(), UptimeS: time.Since(s.started).Seconds(),
			Socket: s.cfg.Socket, MemoryLimit: s.cfg.MemoryLimit, MemoryUsed: used, Sessions: n,
			Probes: s.probeStatus(), CPUBudget: s.cfg.CPUBudget, CPURawBlocks: s.cpu.RawBlocks(), Upload: upd},
		Sessions: sess,
		Uploads:  ups,
	}
}
