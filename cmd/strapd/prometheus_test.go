//go:build privileged

package main

// Root-only (`make test-privileged` builds it with -tags privileged): the kernel probes feed
// the dashboard, and one request is made as another uid.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

// TestPrometheusScrapesCapture runs a real Prometheus (Debian's package; `make prometheus`
// installs it) against a real strapd during real captures, with the shipped rule files
// loaded. Every PromQL expression of deploy/grafana/strapd.json, every recording rule and
// the signal of every alert must return data; the drop alert must fire for a session that
// drops; promtool must accept the shipped config and rules. Meanwhile the JSON API is
// exercised: a resource event written after an SSE client connected reaches it, bad
// requests get clear 4xx, 500 followers are capped with 429, a uid the allow-list refuses
// gets 403, `strapd status --json` has the shape of /api/v1/status, and the captures go
// on undisturbed.
func TestPrometheusScrapesCapture(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the kernel probes (block I/O, syscalls, scheduling) feed half of the dashboard, and the refused-uid check connects as another uid")
	}
	promBin, err1 := exec.LookPath("prometheus")
	promtool, err2 := exec.LookPath("promtool")
	if err := errors.Join(err1, err2); err != nil {
		t.Skipf("Prometheus is not installed and could not be (`make prometheus` runs apt-get install prometheus): %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	deploy := filepath.Join(root, "deploy")
	rules := []string{filepath.Join(deploy, "prometheus/rules/strapd-recording.yml"), filepath.Join(deploy, "prometheus/rules/strapd-alerts.yml")}
	for _, args := range [][]string{{"check", "config", filepath.Join(deploy, "prometheus/prometheus.yml")}, append([]string{"check", "rules"}, rules...)} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	bin := strapdBinary(t)
	dir := shortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil { // uid 65534 must reach the API socket to be refused by the daemon
		t.Fatal(err)
	}
	data, err := os.MkdirTemp("/var/tmp", "strap-prom") // a disk, so block I/O shows up
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	sock, apiSock := filepath.Join(dir, "s.sock"), filepath.Join(dir, "api.sock")
	httpAddr := "127.0.0.1:" + freePort(t)
	d := startDaemon(t, exec.Command(bin, "serve", "--socket", sock, "--http", httpAddr, "--trace-interval", "1s",
		"--memory-limit", "1GiB", "--socket-group", "", "--socket-mode", "0666", "--allow-uid", "4242"))
	c := dialRetry(t, sock)

	prom := startPrometheus(t, promBin, httpAddr, rules)

	// The main capture: zstd, policy block, tokens and checkpoints, until stopped.
	out := filepath.Join(data, "run.strap")
	capture := startCapture(t, c, out)
	// A second client drops: a ring that holds one tensor, filled faster than it drains.
	// Prometheus first sees the drop counter at zero, so the drops are an increase.
	prom.waitSeries(t, `strapd_capture_drops_total{codec="zstd"} == 0`, 30*time.Second)
	dropped := dropSome(t, dialRetry(t, sock), filepath.Join(data, "drop.strap"))
	if dropped == 0 {
		t.Fatal("the drop session dropped nothing: the drop alert cannot be checked")
	}

	// Without --http-metrics-detail nothing in /metrics names a user, a session or a pid.
	if code, body := httpGet(t, http.DefaultClient, "http://"+httpAddr+"/metrics"); code != 200 {
		t.Fatalf("/metrics: %d", code)
	} else if m := regexp.MustCompile(`(?m)^strapd_[^{ ]*\{[^}]*\b(session|uid|pid|path|module)="`).FindString(body); m != "" {
		t.Errorf("/metrics carries per-user detail without --http-metrics-detail: %s", m)
	}
	api := unixClient(apiSock, nil)
	for i := 0; ; i++ { // the probe ticker's first snapshots
		if _, body := httpGet(t, api, "http://strapd/api/v1/trace?n=2"); strings.Contains(body, "latency_histogram") {
			break
		}
		if i == 100 {
			t.Fatal("no kernel snapshot on /api/v1/trace after 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkAPI(t, api, apiSock, capture.session, out)
	checkStatusShape(t, bin, sock, api)

	// Every expression of the dashboard and the rules has data.
	// With host All (".*", as Grafana sends it) and with this strapd's instance chosen.
	exprs := append(dashboardExprs(t, ".*", ".*", false), dashboardExprs(t, grafanaValue(httpAddr), ".*", false)...)
	ruleExprs := prom.ruleExprs(t)
	if len(ruleExprs) < 10 {
		t.Fatalf("Prometheus loaded only %d rule expressions: %v", len(ruleExprs), ruleExprs)
	}
	exprs = append(exprs, ruleExprs...)
	missing := map[string]string{}
	deadline := time.Now().Add(90 * time.Second)
	pending := exprs
	for len(pending) > 0 && time.Now().Before(deadline) {
		var next []string
		for _, e := range pending {
			if n, err := prom.query(e); err != nil || n == 0 {
				missing[e] = fmt.Sprintf("%d series, %v", n, err)
				next = append(next, e)
			} else {
				delete(missing, e)
			}
		}
		pending = next
		if len(pending) > 0 {
			time.Sleep(2 * time.Second)
		}
	}
	if len(missing) > 0 {
		var lines []string
		for e, why := range missing {
			lines = append(lines, fmt.Sprintf("  %s: %s", e, why))
		}
		sort.Strings(lines)
		t.Errorf("%d of %d expressions have no data:\n%s", len(missing), len(exprs), strings.Join(lines, "\n"))
	} else {
		t.Logf("all %d expressions of the dashboard and the rules returned data", len(exprs))
	}
	prom.waitAlert(t, "StrapdCaptureDrops", "firing", 60*time.Second)

	// The captures were not disturbed: the main one still moves and closes cleanly.
	before := capture.bytes.Load()
	time.Sleep(500 * time.Millisecond)
	if capture.bytes.Load() == before {
		t.Error("the capture stopped moving during the API checks")
	}
	closed := capture.stop(t)
	if closed.Drops != 0 || closed.BytesIn == 0 {
		t.Errorf("main capture closed with %+v", closed)
	}
	if code, _ := httpGet(t, http.DefaultClient, "http://"+httpAddr+"/metrics"); code != 200 {
		t.Errorf("/metrics after the checks: %d", code)
	}
	// A follower still open at SIGTERM does not hold the daemon: the stream ends when it exits.
	follower, err := api.Get("http://strapd/api/v1/resource-logs?follow=1")
	if err != nil || follower.StatusCode != 200 {
		t.Fatalf("follower before SIGTERM: %v %v", err, follower)
	}
	defer follower.Body.Close()
	if err := d.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("strapd exit: %v\n%s", err, d.stderr.String())
	}
	if _, err := io.Copy(io.Discard, follower.Body); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("follower after exit: %v", err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// ---- Prometheus --------------------------------------------------------------------------

type promServer struct {
	base string
	hc   *http.Client
}

// startPrometheus runs Prometheus on a loopback port with a temp config and data dir,
// scraping strapd every second with the shipped rule files, and waits until it is ready.
func startPrometheus(t *testing.T, bin, target string, rules []string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q, %q]
scrape_configs:
  - job_name: strapd
    static_configs:
      - targets: [%q]
`, rules[0], rules[1], target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return startPrometheusConfig(t, bin, cfgPath)
}

// startPrometheusConfig runs Prometheus with the config at cfgPath (its data in a temp dir)
// on a loopback port and waits until it is ready.
func startPrometheusConfig(t *testing.T, bin, cfgPath string) *promServer {
	t.Helper()
	dir := t.TempDir()
	addr := "127.0.0.1:" + freePort(t)
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+addr, "--log.level=warn")
	var logs strings.Builder
	var mu sync.Mutex
	cmd.Stdout = io.Discard
	cmd.Stderr = writerFunc(func(b []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(b) })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			mu.Lock()
			t.Logf("prometheus log:\n%s", logs.String())
			mu.Unlock()
		}
	})
	p := &promServer{base: "http://" + addr, hc: &http.Client{Timeout: 10 * time.Second}}
	for i := 0; ; i++ {
		if code, _ := httpGet(t, p.hc, p.base+"/-/ready"); code == 200 {
			return p
		}
		select {
		case err := <-exited:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("prometheus exited: %v\n%s", err, logs.String())
		default:
		}
		if i == 300 {
			t.Fatal("prometheus not ready after 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

type promReply struct {
	Status string          `json:"status"`
	Error  string          `json:"error"`
	Data   json.RawMessage `json:"data"`
}

func (p *promServer) api(path string) (json.RawMessage, error) {
	resp, err := p.hc.Get(p.base + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r promReply
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %d: %w", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", path, r.Error)
	}
	return r.Data, nil
}

// query evaluates expr now and returns how many series it gave.
func (p *promServer) query(expr string) (int, error) {
	data, err := p.api("/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	var v struct {
		Result []json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return 0, err
	}
	return len(v.Result), nil
}

// alertSignal splits an alert expression `<signal> <op> <number>` (the form the alert
// file promises) into its signal.
var alertSignal = regexp.MustCompile(`^(?s)(.*\S)\s*(>=|<=|==|!=|>|<)\s*[-+0-9.e]+$`)

// ruleExprs are the expressions Prometheus actually loaded: each recording rule's expression
// and the series it records, and each alert's signal.
func (p *promServer) ruleExprs(t *testing.T) []string {
	t.Helper()
	data, err := p.api("/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Groups []struct {
			Rules []struct {
				Name  string `json:"name"`
				Query string `json:"query"`
				Type  string `json:"type"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range v.Groups {
		for _, r := range g.Rules {
			switch r.Type {
			case "recording":
				out = append(out, r.Query, r.Name)
			case "alerting":
				m := alertSignal.FindStringSubmatch(r.Query)
				if m == nil {
					t.Errorf("alert %s: expression %q is not `<signal> <comparison> <threshold>`", r.Name, r.Query)
					continue
				}
				out = append(out, m[1])
			}
		}
	}
	return out
}

func (p *promServer) waitSeries(t *testing.T, expr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if n, err := p.query(expr); err == nil && n > 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("Prometheus has no %s after %v", expr, timeout)
}

func (p *promServer) waitAlert(t *testing.T, name, state string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		data, err := p.api("/api/v1/alerts")
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		}
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		for _, a := range v.Alerts {
			if a.Labels["alertname"] == name && a.State == state {
				return
			}
		}
		last = string(data)
		time.Sleep(time.Second)
	}
	t.Errorf("alert %s not %s within %v; alerts: %s", name, state, timeout, last)
}

// dashboardExprs is every expression of the Grafana dashboard's rows but the per-rank one
// (detail false) or of that row only (detail true), with its variables given values.
func dashboardExprs(t *testing.T, host, rank string, detail bool) []string {
	t.Helper()
	var out []string
	for _, tg := range dashboardTargets(t) {
		if tg.Detail != detail {
			continue
		}
		e := resolveVars(tg.Expr, host, rank)
		if strings.Contains(e, "$") {
			t.Errorf("panel %q: expression %q uses a Grafana variable the test cannot resolve", tg.Panel, tg.Expr)
		}
		out = append(out, e)
	}
	if !detail && len(out) < 20 {
		t.Fatalf("only %d expressions in the dashboard", len(out))
	}
	return out
}

// ---- captures ----------------------------------------------------------------------------

type liveCapture struct {
	session uint64
	bytes   atomic.Uint64
	stopCh  chan struct{}
	done    chan struct{}
	closed  control.Closed
	err     error
}

// startCapture streams tensors to out until stop: a TOKEN every 4 tensors and a
// CHECKPOINT every 16, as a generating model would.
func startCapture(t *testing.T, c *control.Client, out string) *liveCapture {
	t.Helper()
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// A resource log, as a client with resource_level set passes one: its events feed the
	// dashboard's per-component panels.
	// O_APPEND: checkAPI appends a line of its own to the same file while strapd writes.
	res, err := os.OpenFile(out+".resources.jsonl", os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	st, opened, err := controltest.OpenStreamResources(c, shm.HeaderSize+4<<20, f, res, control.Open{Codec: "zstd", Policy: "block",
		Metadata: map[string]any{"model_class": "PromTest", "output_path": out}})
	if err != nil {
		t.Fatal(err)
	}
	lc := &liveCapture{session: opened.Session, stopCh: make(chan struct{}), done: make(chan struct{})}
	// The host side of GPU work goes through ioctls on nvidia-named device files; the probe
	// goes by the name, so an "nvidia0" that is the null device (1:3) stands in for one
	// here (its ioctls fail ENOTTY, counted as errors).
	dev := filepath.Join(filepath.Dir(out), "nvidia0")
	if err := unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	nv, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(nv) })
	payloads := make([][]byte, 8)
	for i := range payloads {
		payloads[i] = pipelinetest.Activations(uint64(i+1), 64<<10)
	}
	go func() {
		defer close(lc.done)
		for i := 0; ; i++ {
			select {
			case <-lc.stopCh:
				lc.closed, lc.err = st.Finish()
				return
			default:
			}
			tn := shm.Tensor{Name: fmt.Sprintf("model.layers.%d.mlp", i%8), DType: dtype.Float32, Shape: []uint64{64, 1024},
				Step: uint64(i / 8), Payload: payloads[i%8]}
			if lc.err = st.Put(&tn); lc.err != nil {
				return
			}
			lc.bytes.Add(uint64(len(tn.Payload)))
			if i%4 == 3 {
				if lc.err = c.Token(control.Token{Seq: st.P.TakeSeq(), Index: uint64(i / 4), TokenID: int64(i)}); lc.err != nil {
					return
				}
			}
			if i%8 == 0 {
				// One forward pass's resource events, as the monitor writes them
				// (RESOURCE_EVENTS.md): timed modules with FLOPs computed from shapes.
				now := time.Now().UnixMicro()
				var evs []json.RawMessage
				for j, comp := range []string{"attention", "mlp", "norm"} {
					evs = append(evs, json.RawMessage(fmt.Sprintf(
						`{"event":"compute_execution","timestamp":%d,"step":%d,"forward":%d,"layer_id":%d,"component_type":%q,"module":"model.layers.%d.%s","duration_us":%d,"duration_source":"perf_counter","flops":%d,"flops_source":"computed_from_shapes"}`,
						now, i/8, i/8, i%8, comp, i%8, comp, 100*(j+1), 1<<(20+j))))
				}
				if lc.err = c.Resources(evs...); lc.err != nil {
					return
				}
				if _, err := unix.IoctlGetTermios(nv, unix.TCGETS); !errors.Is(err, unix.ENOTTY) {
					lc.err = fmt.Errorf("ioctl on the stand-in nvidia0: %v, want ENOTTY", err)
					return
				}
			}
			if i%16 == 15 {
				if _, lc.err = c.Checkpoint(st.P.LastSeq()); lc.err != nil {
					return
				}
				if lc.err = st.P.Release(c.Tail); lc.err != nil {
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		select {
		case <-lc.done:
		default:
			close(lc.stopCh)
			<-lc.done
		}
	})
	return lc
}

func (lc *liveCapture) stop(t *testing.T) control.Closed {
	t.Helper()
	close(lc.stopCh)
	<-lc.done
	if lc.err != nil {
		t.Fatalf("capture: %v", lc.err)
	}
	return lc.closed
}

// dropSome runs a policy-drop session whose ring holds one tensor, putting faster than the
// daemon drains, and returns how many records it dropped.
func dropSome(t *testing.T, c *control.Client, out string) uint64 {
	t.Helper()
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+96<<10, f, control.Open{Codec: "zstd", Policy: "drop",
		Metadata: map[string]any{"output_path": out}})
	if err != nil {
		t.Fatal(err)
	}
	payload := pipelinetest.Activations(9, 16<<10)
	for i := 0; i < 2000 && st.Drops < 20; i++ {
		tn := shm.Tensor{Name: "model.layers.0", DType: dtype.Float32, Shape: []uint64{16 << 10}, Payload: payload}
		if err := st.Put(&tn); err != nil && !errors.Is(err, controltest.ErrDropped) {
			t.Fatal(err)
		}
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	return st.Drops
}

// ---- the API during the capture ----------------------------------------------------------

// unixClient sends every request over a new connection to sock; dial, when set, makes it.
func unixClient(sock string, dial func() (net.Conn, error)) *http.Client {
	if dial == nil {
		dial = func() (net.Conn, error) { return net.Dial("unix", sock) }
	}
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return dial() },
		DisableKeepAlives: true,
	}}
}

func httpGet(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// dialAs connects to sock with another uid and gid. Credentials are per thread in Linux:
// the raw syscalls change one locked thread, discarded when its goroutine ends (it is
// never unlocked), so the test process stays root.
func dialAs(sock string, uid, gid int) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		for _, s := range []struct {
			nr, a, b, c uintptr
		}{{syscall.SYS_SETGROUPS, 0, 0, 0}, {syscall.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)},
			{syscall.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)}} {
			if _, _, e := syscall.RawSyscall(s.nr, s.a, s.b, s.c); e != 0 {
				ch <- res{err: fmt.Errorf("drop to uid %d: %w", uid, e)}
				return
			}
		}
		c, err := net.Dial("unix", sock)
		ch <- res{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

func checkAPI(t *testing.T, api *http.Client, apiSock string, session uint64, out string) {
	t.Helper()
	base := "http://strapd/api/v1"
	// Bad requests: clear 4xx with a JSON error.
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/sessions/999999", 404, "unknown_session"},
		{"/sessions/x", 400, "want a positive integer"},
		{"/resource-logs?since=last-tuesday", 400, "since"},
		{"/resource-logs?session=999999&follow=1", 404, "unknown_session"},
		{"/trace?n=1000", 400, "want 1..60"},
		{fmt.Sprintf("/sessions/%d", session), 200, `"model_class": "PromTest"`},
		{"/trace?n=2", 200, `"latency_histogram"`},
	} {
		if code, body := httpGet(t, api, base+tc.path); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %.300s; want %d with %q", tc.path, code, body, tc.code, tc.want)
		}
	}
	// A uid the allow-list (--allow-uid 4242) does not name is refused, as on the control socket.
	nobody := unixClient(apiSock, func() (net.Conn, error) { return dialAs(apiSock, 65534, 65534) })
	if code, body := httpGet(t, nobody, base+"/status"); code != http.StatusForbidden || !strings.Contains(body, "access_denied") {
		t.Errorf("status as uid 65534: %d %s; want 403 access_denied", code, body)
	}

	// SSE: a resource event written after the client connected reaches it.
	resp, err := api.Get(fmt.Sprintf("%s/resource-logs?session=%d&follow=1&event=alloc&layer=3", base, session))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); resp.StatusCode != 200 || err != nil || !strings.HasPrefix(line, ": following") {
		t.Fatalf("follow: %d %q %v", resp.StatusCode, line, err)
	}
	logf, err := os.OpenFile(out+".resources.jsonl", os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(logf, `{"timestamp": %d, "event": "alloc", "layer_id": 3, "module": "model.layers.3.mlp", "bytes": 4096}`+"\n",
		time.Now().UnixMicro())
	logf.Close()
	got := make(chan string, 1)
	go func() {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				close(got)
				return
			}
			if strings.HasPrefix(line, "data: ") {
				got <- line
				return
			}
		}
	}()
	select {
	case line, ok := <-got:
		if !ok || !strings.Contains(line, `"module":"model.layers.3.mlp"`) || !strings.Contains(line, fmt.Sprintf(`"session":%d`, session)) {
			t.Errorf("SSE delivered %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Error("the resource event written after connecting did not arrive in 10 s")
	}

	// 500 followers at once: the first 64 (the default cap) stream, the rest get 429.
	var ok, refused, other atomic.Int32
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bodies []io.Closer
	for range 500 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := api.Get(base + "/resource-logs?follow=1")
			if err != nil {
				other.Add(1)
				return
			}
			switch r.StatusCode {
			case 200:
				ok.Add(1)
				mu.Lock()
				bodies = append(bodies, r.Body)
				mu.Unlock()
				return
			case http.StatusTooManyRequests:
				refused.Add(1)
			default:
				other.Add(1)
			}
			r.Body.Close()
		}()
	}
	wg.Wait()
	// The follower above is still open: 63 more fit.
	if ok.Load() != 63 || refused.Load() != 437 || other.Load() != 0 {
		t.Errorf("500 followers: %d streams, %d refused with 429, %d other", ok.Load(), refused.Load(), other.Load())
	}
	if code, _ := httpGet(t, api, base+"/status"); code != 200 {
		t.Errorf("status while the followers are open: %d", code)
	}
	for _, b := range bodies {
		b.Close()
	}
}

// checkStatusShape: `strapd status --json` and /api/v1/status have the same fields.
func checkStatusShape(t *testing.T, bin, sock string, api *http.Client) {
	t.Helper()
	cli, err := exec.Command(bin, "status", "--socket", sock, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	_, body := httpGet(t, api, "http://strapd/api/v1/status")
	var a, b any
	if err := json.Unmarshal(cli, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatal(err)
	}
	if sa, sb := shape(a), shape(b); sa != sb {
		t.Errorf("strapd status --json and /api/v1/status differ in shape:\n%s\n%s", sa, sb)
	}
}

// shape describes a JSON value's keys and types, not its values.
func shape(v any) string {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, k+":"+shape(x[k]))
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		if len(x) == 0 {
			return "[]"
		}
		return "[" + shape(x[0]) + "]"
	case float64:
		return "n"
	case string:
		return "s"
	case bool:
		return "b"
	case nil:
		return "null"
	}
	return "?"
}
