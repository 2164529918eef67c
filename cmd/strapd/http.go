package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/httpapi"
	"github.com/strap-llm/strap/internal/metrics"
	"github.com/strap-llm/strap/internal/server"
	"github.com/strap-llm/strap/internal/trace"
)

// httpConfig is serve's --http* flags (docs/HTTP_API.md).
type httpConfig struct {
	// Addr is host:port for /metrics over TCP; empty: no HTTP at all (the default).
	Addr string
	// APISocket is the JSON API's Unix socket; empty: api.sock beside the control socket.
	APISocket string
	// MetricsDetail adds per-session series (session, uid, pid) to /metrics.
	MetricsDetail bool
	// MaxFollowers bounds the resource-log streams open at once.
	MaxFollowers int
}

// traceSnapshots is how many kernel snapshots /api/v1/trace can return.
const traceSnapshots = 60

func (c *httpConfig) validate() error {
	if c.Addr == "" {
		if c.APISocket != "" || c.MetricsDetail {
			return errors.New("--http-api-socket and --http-metrics-detail need --http ADDR")
		}
		return nil
	}
	host, port, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("--http %q: want host:port, e.g. 127.0.0.1:9464: %w", c.Addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("--http %q: port %q is not a number 0..65535", c.Addr, port)
	}
	if host == "" {
		return fmt.Errorf("--http %q: name the address to listen on (127.0.0.1 keeps /metrics on this host; 0.0.0.0 opens it to the network)", c.Addr)
	}
	if c.APISocket != "" && !filepath.IsAbs(c.APISocket) {
		return fmt.Errorf("--http-api-socket %q: want an absolute path", c.APISocket)
	}
	if c.MaxFollowers < 1 || c.MaxFollowers > 10000 {
		return fmt.Errorf("--http-max-followers %d: must be 1..10000", c.MaxFollowers)
	}
	return nil
}

// apiSocket is the API socket's path: the flag, or api.sock beside the control socket.
func (c *httpConfig) apiSocket(control string) string {
	if c.APISocket != "" {
		return c.APISocket
	}
	return filepath.Join(filepath.Dir(control), "api.sock")
}

// observer hands the server's events to metrics and keeps the snapshots for the API.
type observer struct {
	*metrics.Metrics
	ring *httpapi.SnapshotRing // nil without probes
}

// ObserveSnapshot feeds both the metrics and /api/v1/trace.
func (o *observer) ObserveSnapshot(s trace.Snapshot) {
	o.Metrics.ObserveSnapshot(s)
	if o.ring != nil {
		o.ring.Add(s)
	}
}

// apiBackend answers the API with the control socket's own rules.
type apiBackend struct{ srv *server.Server }

func (b apiBackend) Admit(p *httpapi.Peer) error { return b.srv.Admit(&p.Cred, p.Groups) }

func (b apiBackend) Status(p *httpapi.Peer) control.StatusReply { return b.srv.StatusFor(&p.Cred) }

// newObserver builds the metrics for a daemon whose server is *srv once New returns.
func newObserver(cfg httpConfig, probes bool, srv **server.Server) *observer {
	m := metrics.New(metrics.Options{
		Status: func() control.StatusReply { return (*srv).Status() },
		Pool: func() metrics.PoolStats {
			var p metrics.PoolStats
			p.Workers, p.Busy, p.Queued, p.BusySeconds = (*srv).PoolLoad()
			p.Idle, p.Rescued = (*srv).PoolIdle()
			return p
		},
		Detail: cfg.MetricsDetail,
		Codecs: codec.Names(),
	})
	o := &observer{Metrics: m}
	if probes {
		o.ring = httpapi.NewSnapshotRing(traceSnapshots)
	}
	return o
}

// startHTTP listens on --http (for /metrics) and on the API socket, then serves both until
// ctx ends; wait blocks until they stopped. A listener that cannot open is an error
// before the daemon serves anything.
func startHTTP(ctx context.Context, cfg httpConfig, srv *server.Server, obs *observer, mode os.FileMode, gid int,
	log *zap.Logger) (wait func(), err error) {
	log = log.With(zap.String("component", "http"))
	apiPath := cfg.apiSocket(srv.Socket())
	tcp, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("--http: %w", err)
	}
	unixLn, err := httpapi.Listen(apiPath, uint32(mode.Perm()), gid)
	if err != nil {
		tcp.Close()
		return nil, err
	}
	var trace httpapi.TraceSource
	if obs.ring != nil {
		trace = obs.ring
	}
	api := httpapi.NewHandler(httpapi.Options{Backend: apiBackend{srv}, Trace: trace, MaxFollowers: cfg.MaxFollowers,
		Log: log})
	var wg sync.WaitGroup
	run := func(name string, serve func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server stopped", zap.String("listener", name), zap.Error(err))
			}
		}()
	}
	run("metrics", func() error { return httpapi.ServeTCP(ctx, tcp, httpapi.TCPHandler(obs.Handler(), apiPath)) })
	run("api", func() error { return httpapi.Serve(ctx, unixLn, api) })
	log.Info("http serving", zap.String("metrics", "http://"+tcp.Addr().String()+"/metrics"),
		zap.String("api_socket", apiPath), zap.Bool("metrics_detail", cfg.MetricsDetail))
	return wg.Wait, nil
}
