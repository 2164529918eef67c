//go:build privileged

package main

// Under the privileged tag because `make test-privileged` is the target that installs
// Prometheus (`make prometheus`); the test itself needs no root.

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

// series evaluates expr now and returns each series' labels.
func (p *promServer) series(expr string) ([]map[string]string, error) {
	data, err := p.api("/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	var v struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	out := make([]map[string]string, len(v.Result))
	for i, r := range v.Result {
		out[i] = r.Metric
	}
	return out, nil
}

// waitLabels waits until expr gives exactly want series whose labels include each of the
// wanted ones, in any order.
func (p *promServer) waitLabels(t *testing.T, expr string, want []map[string]string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var got []map[string]string
	var err error
	for time.Now().Before(deadline) {
		if got, err = p.series(expr); err == nil && matchAll(got, want) {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s: got %v (%v), want series with %v", expr, got, err, want)
}

func matchAll(got, want []map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	used := make([]bool, len(got))
	for _, w := range want {
		found := false
		for i, g := range got {
			if used[i] {
				continue
			}
			ok := true
			for k, v := range w {
				ok = ok && g[k] == v
			}
			if ok {
				used[i], found = true, true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// TestPrometheusScrapesFleet runs the shipped fleet config (deploy/prometheus/
// prometheus-fleet.yml, file-based service discovery) in a real Prometheus against two
// strapd on this machine standing for two hosts, each serving one rank of a job with
// --http-metrics-detail. The shipped example targets file is read as Prometheus reads it;
// the real targets file then brings both strapd up; strapd_session_info and the per-session
// series carry each rank with its host, from the strapd that serves it; every query of the
// dashboard's Ranks row has data with the variables at All, and the host and rank variables
// filter (one rank chosen on the other rank's host gives nothing); `strapd status --json`
// of each host names the same session and rank.
func TestPrometheusScrapesFleet(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skipf("Prometheus is not installed and could not be (`make prometheus` runs apt-get install prometheus): %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The shipped config and rules as they are, in a temp copy of deploy/prometheus, at a
	// 1 s scrape and evaluation interval.
	cfg, err := os.ReadFile(filepath.Join(root, "deploy/prometheus/prometheus-fleet.yml"))
	if err != nil {
		t.Fatal(err)
	}
	fast := regexp.MustCompile(`(?m)^(\s*(?:scrape|evaluation)_interval:)\s*\S+`).ReplaceAll(cfg, []byte("$1 1s"))
	pdir := t.TempDir()
	for _, sub := range []string{"rules", "targets"} {
		if err := os.Mkdir(filepath.Join(pdir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"rules/strapd-recording.yml", "rules/strapd-alerts.yml"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy/prometheus", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pdir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	example, err := os.ReadFile(filepath.Join(root, "deploy/prometheus/targets/strapd.yml.example"))
	if err != nil {
		t.Fatal(err)
	}
	targets := filepath.Join(pdir, "targets", "strapd.yml")
	if err := os.WriteFile(targets, example, 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(pdir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, fast, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "config", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	prom := startPrometheusConfig(t, promBin, cfgPath)
	// The example's hosts are discovered (they do not exist here: down, but targets).
	prom.waitLabels(t, `up{job="strapd"}`, []map[string]string{{"instance": "node01:9464"}, {"instance": "node02:9464"}}, 30*time.Second)

	// Two hosts: two strapd, each its own socket, output directory and HTTP port.
	bin := strapdBinary(t)
	type host struct {
		name, sock, addr, out string
		session               uint64
		stream                *controltest.Stream
	}
	hosts := []*host{{name: "node-a"}, {name: "node-b"}}
	for i, h := range hosts {
		dir := shortDir(t)
		h.sock, h.addr, h.out = filepath.Join(dir, "s.sock"), "127.0.0.1:"+freePort(t), filepath.Join(dir, fmt.Sprintf("cap.rank%05d-of-00002.strap", i))
		startDaemon(t, exec.Command(bin, "serve", "--socket", h.sock, "--http", h.addr, "--http-metrics-detail", "--no-probes"))
		c := dialRetry(t, h.sock)
		f, err := os.OpenFile(h.out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		dist := map[string]any{"rank": i, "world_size": 2, "local_rank": 0, "local_world_size": 1, "host": h.name,
			"source": "env", "job_id": "job-7"}
		st, opened, err := controltest.OpenStream(c, shm.HeaderSize+256<<10, f, control.Open{Codec: "none", Policy: "block",
			Metadata: map[string]any{"model_class": "FleetTest", "output_path": h.out, "distributed": dist}})
		if err != nil {
			t.Fatal(err)
		}
		tn := shm.Tensor{Name: "model.h.0", DType: dtype.Float32, Shape: []uint64{4, 64}, Payload: pipelinetest.Activations(uint64(i+1), 256)}
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
		h.session, h.stream = opened.Session, st
	}
	var lines []string
	for _, h := range hosts {
		lines = append(lines, "    - "+h.addr)
	}
	// Written whole and renamed in: Prometheus watches the directory and must never read
	// half a file.
	tmp := filepath.Join(pdir, "targets", ".strapd.yml.tmp")
	if err := os.WriteFile(tmp, []byte("- targets:\n"+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, targets); err != nil {
		t.Fatal(err)
	}
	prom.waitLabels(t, `up{job="strapd"} == 1`, []map[string]string{{"instance": hosts[0].addr}, {"instance": hosts[1].addr}}, 60*time.Second)

	sess := func(i int) string { return fmt.Sprint(hosts[i].session) }
	prom.waitLabels(t, `strapd_session_info{job_id="job-7"}`, []map[string]string{
		{"instance": hosts[0].addr, "rank": "0", "world_size": "2", "session": sess(0)},
		{"instance": hosts[1].addr, "rank": "1", "world_size": "2", "session": sess(1)}}, 30*time.Second)
	prom.waitLabels(t, `strapd_session_ring_fill_ratio`, []map[string]string{
		{"instance": hosts[0].addr, "rank": "0", "host": "node-a", "session": sess(0)},
		{"instance": hosts[1].addr, "rank": "1", "host": "node-b", "session": sess(1)}}, 30*time.Second)

	// The dashboard's Ranks row: data at All; the variables filter.
	for _, e := range dashboardExprs(t, ".*", ".*", true) {
		prom.waitSeries(t, e, 30*time.Second)
	}
	for _, e := range dashboardExprs(t, grafanaValue(hosts[1].addr), "1", true) {
		prom.waitSeries(t, e, 30*time.Second)
	}
	for _, e := range dashboardExprs(t, grafanaValue(hosts[0].addr), "1", true) {
		if n, err := prom.query(e); err != nil || n != 0 {
			t.Errorf("rank 1 chosen on %s (which serves rank 0): %s gave %d series (%v)", hosts[0].addr, e, n, err)
		}
	}

	// Each host's status names the session the metrics name, with its rank.
	for i, h := range hosts {
		out, err := exec.Command(bin, "status", "--json", "--socket", h.sock).Output()
		if err != nil {
			t.Fatalf("strapd status --json on %s: %v", h.name, err)
		}
		var rep control.StatusReply
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Sessions) != 1 || rep.Sessions[0].Session != h.session || rep.Sessions[0].Distributed == nil ||
			rep.Sessions[0].Distributed.Rank != uint64(i) || rep.Sessions[0].Distributed.Host != h.name ||
			rep.Sessions[0].Distributed.WorldSize != 2 || rep.Sessions[0].Distributed.JobID != "job-7" {
			t.Errorf("%s: status %s", h.name, out)
		}
		if _, err := h.stream.Finish(); err != nil {
			t.Fatal(err)
		}
	}
}
