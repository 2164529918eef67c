package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// namedMetrics returns every strapd series the shipped Grafana dashboard and the alert
// rules name (recording rules' own strapd:… names are Prometheus's, not strapd's; the
// series they read are included through the rules that read them and the dashboard).
func namedMetrics(t *testing.T) []string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The per-rank row reads per-session series, which need --http-metrics-detail: they are
	// checked by TestPrometheusScrapesFleet, which turns it on.
	var exprs []string
	for _, tg := range dashboardTargets(t) {
		if !tg.Detail {
			exprs = append(exprs, tg.Expr)
		}
	}
	rules, err := filepath.Glob(filepath.Join(root, "deploy/prometheus/rules/*.yml"))
	if err != nil || len(rules) == 0 {
		t.Fatalf("no rule files: %v", err)
	}
	// Rule files keep each expression on its `expr:` line (promtool checks them in
	// make check-deploy); a multi-line expression would show up here as a missing name.
	exprLine := regexp.MustCompile(`(?m)^\s*expr:\s*(.+)$`)
	for _, r := range rules {
		b, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range exprLine.FindAllStringSubmatch(string(b), -1) {
			exprs = append(exprs, m[1])
		}
	}
	name := regexp.MustCompile(`\bstrapd_[a-z0-9_]+`)
	var out []string
	for _, e := range exprs {
		out = append(out, name.FindAllString(e, -1)...)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) < 30 {
		t.Fatalf("only %d strapd series named by the dashboard and rules: %v", len(out), out)
	}
	return out
}

// kernelCollectorOf names the kernel collector behind a kernel series: without it (a
// collector that is off, as the bpf-only ones are without root) the series is absent by
// design and strapd_probe_collector_up says so.
func kernelCollectorOf(series string) string {
	for _, p := range []struct{ prefix, collector string }{
		{"strapd_block_io_", "block_io"}, {"strapd_offcpu_", "off_cpu"}, {"strapd_page_faults", "page_faults"},
		{"strapd_syscalls_total", "syscalls"}, {"strapd_syscall_bytes_", "syscalls"}, {"strapd_openat_failed_", "syscalls"},
		{"strapd_nvidia_opens_", "syscalls"}, {"strapd_context_switches_", "sched"}, {"strapd_cpu_migrations_", "sched"},
		{"strapd_pressure_", "pressure"}, {"strapd_syscall_", "syscall_latency"}, {"strapd_sync_wait_", "sync_wait"},
		{"strapd_runqueue_", "runqueue"}, {"strapd_nvidia_ioctl_", "nvidia_ioctl"}, {"strapd_tcp_", "tcp"},
		{"strapd_watched_resident_", "memory"},
	} {
		if strings.HasPrefix(series, p.prefix) {
			return p.collector
		}
	}
	return ""
}

// TestServeMetricsAndLog runs a real strapd with --http and --log-file. Its first /metrics
// scrape after the first kernel snapshot, before any capture, has every series the
// dashboard and the alert rules name (at 0 where nothing happened: an idle disk's
// strapd_block_io_inflight included), so no panel says "No data" and no alert watches a
// missing series. Then a capture runs, and every line of the log is one JSON object that
// names each key once (one component per line: log shippers reject or collapse duplicates).
func TestServeMetricsAndLog(t *testing.T) {
	bin := strapdBinary(t)
	dir := shortDir(t)
	sock := filepath.Join(dir, "s.sock")
	logPath := filepath.Join(dir, "strapd.log")
	port := loopbackPort(t)
	d := startDaemon(t, exec.Command(bin, "serve", "--socket", sock, "--workers", "1", "--log-file", logPath,
		"--http", "127.0.0.1:"+port, "--trace-interval", "200ms"))
	dialRetry(t, sock).Disconnect()

	// Disk I/O that a snapshot will see: any host has it; this test must not rely on luck.
	f, err := os.Create(filepath.Join(dir, "io"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	synced := float64(time.Now().UnixNano()) / 1e9

	t.Run("every metric the dashboard and the alerts name", func(t *testing.T) {
		var body string
		deadline := time.Now().Add(15 * time.Second)
		for {
			body = scrape(t, "http://127.0.0.1:"+port+"/metrics")
			if ts, ok := sampleValue(body, "strapd_probe_last_snapshot_timestamp_seconds", ""); ok && ts > synced+0.25 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no kernel snapshot after the write within 15 s:\n%s", body)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, name := range namedMetrics(t) {
			if hasSeries(body, name) {
				continue
			}
			if c := kernelCollectorOf(name); c != "" {
				if up, ok := sampleValue(body, "strapd_probe_collector_up", `{collector="`+c+`"}`); ok && up == 0 {
					t.Logf("%s absent: its collector %s is off here (strapd_probe_collector_up 0)", name, c)
					continue
				}
			}
			t.Errorf("%s: named by the dashboard or an alert rule, absent from a fresh scrape", name)
		}
	})

	c := dialRetry(t, sock)
	captureSome(t, c, filepath.Join(dir, "run.strap"), 2, true)
	waitFile(t, logPath, "session finished")
	if err := d.stop(t, syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.stderr.String())
	}

	t.Run("log lines name each key once", func(t *testing.T) {
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		components := map[string]bool{}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for n := 1; sc.Scan(); n++ {
			keys, err := topLevelKeys(sc.Bytes())
			if err != nil {
				t.Fatalf("line %d: %v: %s", n, err, sc.Bytes())
			}
			seen := map[string]bool{}
			for _, k := range keys {
				if seen[k] {
					t.Errorf("line %d names %q twice: %s", n, k, sc.Bytes())
				}
				seen[k] = true
			}
			var line struct {
				Component string `json:"component"`
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.Component == "" {
				t.Errorf("line %d has no component: %s", n, sc.Bytes())
			}
			components[line.Component] = true
		}
		for _, want := range []string{"strapd", "server", "session", "probes", "http"} {
			if !components[want] {
				t.Errorf("no line of component %q; components: %v", want, components)
			}
		}
	})
}

// topLevelKeys lists the keys of the JSON object b in order, repeats included (a decode
// into a map would hide them).
func topLevelKeys(b []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object (%v)", err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the object")
	}
	return keys, nil
}

// loopbackPort is a TCP port free on 127.0.0.1 a moment ago.
func loopbackPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	for i := 0; ; i++ {
		resp, err := http.Get(url)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
			err = fmt.Errorf("status %d, %v", resp.StatusCode, rerr)
		}
		if i == 100 {
			t.Fatalf("scrape %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hasSeries reports whether the exposition text has a sample of the series name (with or
// without labels).
func hasSeries(body, name string) bool {
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			return true
		}
	}
	return false
}

// sampleValue returns the value of the sample name+labels ("" labels: unlabelled).
func sampleValue(body, name, labels string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, name+labels+" "); ok {
			v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			return v, err == nil
		}
	}
	return 0, false
}
