package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/trace"
)

// Backend is what the API reads from the daemon.
type Backend interface {
	// Admit returns an error when the daemon's allow-lists refuse the peer, as they would
	// refuse its connection to the control socket.
	Admit(p *Peer) error
	// Status is what STATUS on the control socket answers this peer.
	Status(p *Peer) control.StatusReply
}

// TraceSource holds the most recent kernel snapshots.
type TraceSource interface {
	// Snapshots returns up to n of the most recent snapshots, oldest first; ok is false
	// when the daemon runs without probes.
	Snapshots(n int) (snaps []trace.Snapshot, ok bool)
}

// Options configure the API handler.
type Options struct {
	// Backend answers status and access questions; required.
	Backend Backend
	// Trace serves /api/v1/trace; nil: the daemon runs without probes.
	Trace TraceSource
	// MaxFollowers bounds the resource-log streams open at once (follow=1); further
	// ones get 429. 0: DefaultMaxFollowers.
	MaxFollowers int
	// Poll is how often a follower looks for new lines and sessions. 0: 250 ms.
	Poll time.Duration
	// Heartbeat is how often an idle stream sends an SSE comment, so proxies and clients
	// see it alive. 0: 15 s.
	Heartbeat time.Duration
	// Log receives request errors; nil: none.
	Log *zap.Logger
}

// DefaultMaxFollowers is Options.MaxFollowers when zero.
const DefaultMaxFollowers = 64

// Limits on query parameters.
const (
	maxTraceSnapshots = 60
	defaultLimit      = 10000
	maxLimit          = 100000
)

// Handler serves /api/v1/*.
type Handler struct {
	opts      Options
	mux       *http.ServeMux
	followers atomic.Int32
}

// NewHandler builds the API handler.
func NewHandler(o Options) *Handler {
	if o.MaxFollowers <= 0 {
		o.MaxFollowers = DefaultMaxFollowers
	}
	if o.Poll <= 0 {
		o.Poll = 250 * time.Millisecond
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 15 * time.Second
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	h := &Handler{opts: o, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /api/v1/status", h.status)
	h.mux.HandleFunc("GET /api/v1/sessions", h.sessions)
	h.mux.HandleFunc("GET /api/v1/sessions/{id}", h.session)
	h.mux.HandleFunc("GET /api/v1/trace", h.trace)
	h.mux.HandleFunc("GET /api/v1/resource-logs", h.resourceLogs)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no endpoint %s %s (docs/HTTP_API.md)", r.Method, r.URL.Path))
	})
	return h
}

// ServeHTTP checks the peer, then routes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, err := peerFrom(r.Context())
	if err != nil {
		writeError(w, http.StatusForbidden, "access_denied", err.Error())
		return
	}
	if err := h.opts.Backend.Admit(p); err != nil {
		writeError(w, http.StatusForbidden, "access_denied", err.Error())
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "the API is read-only: use GET")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// apiError is every error body.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var e apiError
	e.Error.Code, e.Error.Message = code, msg
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the peer hung up: nothing to tell it
}

// checkParams refuses query parameters the endpoint does not know, so a typo is not
// silently ignored.
func checkParams(w http.ResponseWriter, r *http.Request, known ...string) bool {
	for k := range r.URL.Query() {
		ok := false
		for _, n := range known {
			ok = ok || k == n
		}
		if !ok {
			msg := fmt.Sprintf("unknown query parameter %q", k)
			if len(known) > 0 {
				msg += " (known: " + strings.Join(known, ", ") + ")"
			}
			writeError(w, http.StatusBadRequest, "bad_request", msg)
			return false
		}
	}
	return true
}

func (h *Handler) peer(r *http.Request) *Peer {
	p, _ := peerFrom(r.Context())
	return p
}

func (h *Handler) status(w http.ResponseWriter, r *http.Request) {
	if checkParams(w, r) {
		writeJSON(w, http.StatusOK, h.opts.Backend.Status(h.peer(r)))
	}
}

// SessionList is the body of /api/v1/sessions.
type SessionList struct {
	// Sessions are the sessions the peer may see (its own; root: all), by id.
	Sessions []control.SessionStatus `json:"sessions"`
	// Hidden counts the open sessions of other users, which are not listed.
	Hidden int `json:"hidden"`
}

func (h *Handler) sessions(w http.ResponseWriter, r *http.Request) {
	if !checkParams(w, r) {
		return
	}
	st := h.opts.Backend.Status(h.peer(r))
	out := SessionList{Sessions: st.Sessions, Hidden: max(st.Daemon.Sessions-len(st.Sessions), 0)}
	if out.Sessions == nil {
		out.Sessions = []control.SessionStatus{}
	}
	writeJSON(w, http.StatusOK, out)
}

// parseID reads a session id; false (and a 400 written) when it is not one.
func parseID(w http.ResponseWriter, s string) (uint64, bool) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("session id %q: want a positive integer", s))
		return 0, false
	}
	return id, true
}

func findSession(st control.StatusReply, id uint64) (control.SessionStatus, bool) {
	for _, s := range st.Sessions {
		if s.Session == id {
			return s, true
		}
	}
	return control.SessionStatus{}, false
}

// errUnknownSession is the message for a session that does not exist or that the peer
// may not see: the two are not told apart, so ids of other users' sessions do not leak.
const errUnknownSession = "no open session %d that you may see"

func (h *Handler) session(w http.ResponseWriter, r *http.Request) {
	if !checkParams(w, r) {
		return
	}
	id, ok := parseID(w, r.PathValue("id"))
	if !ok {
		return
	}
	s, ok := findSession(h.opts.Backend.Status(h.peer(r)), id)
	if !ok {
		writeError(w, http.StatusNotFound, "unknown_session", fmt.Sprintf(errUnknownSession, id))
		return
	}
	writeJSON(w, http.StatusOK, s)
}

// TraceReply is the body of /api/v1/trace.
type TraceReply struct {
	// Snapshots are the most recent kernel snapshots, oldest first, with per-process
	// numbers kept only for processes the peer may see.
	Snapshots []trace.Snapshot `json:"snapshots"`
}

func (h *Handler) trace(w http.ResponseWriter, r *http.Request) {
	if !checkParams(w, r, "n") {
		return
	}
	n := 1
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > maxTraceSnapshots {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("n %q: want 1..%d", v, maxTraceSnapshots))
			return
		}
	}
	var snaps []trace.Snapshot
	ok := false
	if h.opts.Trace != nil {
		snaps, ok = h.opts.Trace.Snapshots(n)
	}
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "no_probes", "this strapd runs without the kernel collector (serve --no-probes, or it failed to start: see /api/v1/status daemon.probes)")
		return
	}
	p := h.peer(r)
	st := h.opts.Backend.Status(p)
	out := TraceReply{Snapshots: make([]trace.Snapshot, 0, len(snaps))}
	for _, s := range snaps {
		out.Snapshots = append(out.Snapshots, filterSnapshot(s, p, st))
	}
	writeJSON(w, http.StatusOK, out)
}

// filterSnapshot keeps in s what the peer may see: device-wide and system-wide numbers
// (block I/O, PSI, probe health) for everyone; per-process numbers and session names for
// strapd itself and the peer's own sessions' clients; everything for root. It is the
// rule the control socket's STATUS applies to the watched set.
func filterSnapshot(s trace.Snapshot, p *Peer, st control.StatusReply) trace.Snapshot {
	if p.Root() {
		return s
	}
	pids := map[int]bool{st.Daemon.PID: true}
	ids := map[string]bool{}
	for _, ss := range st.Sessions {
		pids[int(ss.PID)] = true
		ids[strconv.FormatUint(ss.Session, 10)] = true
	}
	s.Sessions = filterSlice(s.Sessions, func(x trace.Session) bool { return ids[x.ID] })
	s.Watched = filterSlice(s.Watched, func(pid int) bool { return pids[pid] })
	s.DeviceOpens = filterSlice(s.DeviceOpens, func(d trace.DeviceOpen) bool { return pids[d.PID] })
	s.Threads = filterSlice(s.Threads, func(t trace.Thread) bool { return pids[t.PID] })
	s.TokensKernel = filterSlice(s.TokensKernel, func(t trace.TokenKernel) bool { return pids[t.PID] })
	s.ModelLoad = filterSlice(s.ModelLoad, func(m trace.ModelLoad) bool { return pids[m.PID] })
	s.Spans = filterSlice(s.Spans, func(x trace.Span) bool { return pids[x.PID] })
	// Per-process maps are keyed by the decimal tgid (TRACE_FORMAT.md). Every map of the
	// snapshot goes through this rule, so a collector added later is filtered without a
	// change here; keys that are not numbers (devices, PSI resources, collectors, drop
	// reasons) are not per process and stay.
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Map || f.Type().Key().Kind() != reflect.String || f.IsNil() || !f.CanSet() {
			continue
		}
		out := reflect.MakeMapWithSize(f.Type(), f.Len())
		for it := f.MapRange(); it.Next(); {
			if n, err := strconv.Atoi(it.Key().String()); err != nil || pids[n] {
				out.SetMapIndex(it.Key(), it.Value())
			}
		}
		f.Set(out)
	}
	return s
}

func filterSlice[T any](in []T, keep func(T) bool) []T {
	if in == nil {
		return nil
	}
	out := make([]T, 0, len(in))
	for _, x := range in {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// Listen creates the API's Unix socket at path with mode and group gid (0: unchanged),
// removing a stale socket first; a live one (another daemon answers) is an error.
func Listen(path string, mode uint32, gid int) (*net.UnixListener, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("api socket %s: another process is serving on it", path)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	ln, err := listenPrivate(path)
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if gid > 0 {
		if err := lchown(path, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("api socket group %d: %w", gid, err)
		}
	}
	if err := chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("api socket mode %o: %w", mode, err)
	}
	return ln, nil
}

// Serve serves h on ln until ctx is done, with each connection's peer credentials
// attached to its requests. Open streams end when ctx does.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := newServer(ctx, h)
	srv.ConnContext = peerContext
	return serve(ctx, srv, ln)
}

// ServeTCP serves h (the /metrics side) on ln until ctx is done. Requests carry no peer.
func ServeTCP(ctx context.Context, ln net.Listener, h http.Handler) error {
	return serve(ctx, newServer(ctx, h), ln)
}

func newServer(ctx context.Context, h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute, // idle keep-alive connections do not pile up
		MaxHeaderBytes:    64 << 10,
	}
}

func serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	if serr := <-done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// TCPHandler serves /metrics from metrics; every /api path answers 404 with where the API
// is, because over TCP the daemon cannot tell who asks.
func TCPHandler(metrics http.Handler, apiSocket string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "api_on_unix_socket",
			fmt.Sprintf("the API is served on the Unix socket %s, where the kernel names the caller (docs/HTTP_API.md)", apiSocket))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "strapd: /metrics here; the JSON API on the Unix socket %s\n", apiSocket)
	})
	return mux
}
