package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"4096", 4096, false},
		{"512MiB", 512 << 20, false},
		{"1GiB", 1 << 30, false},
		{"1G", 1 << 30, false},
		{"10MB", 10e6, false},
		{"64kib", 64 << 10, false},
		{" 2 GiB ", 2 << 30, false},
		{"-1", 0, true},
		{"1.5GiB", 0, true},
		{"GiB", 0, true},
		{"99999999999TiB", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseByteSize(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("parseByteSize(%q) = %d, %v", tc.in, got, err)
			}
		})
	}
}

func TestServeConfigValidate(t *testing.T) {
	base := func() serveConfig {
		var c serveConfig
		c.Memory.Limit = 1 << 30
		c.Pipeline.MaxBlockSize = 1 << 20
		c.Limits.MaxSessions = 4
		c.Limits.MaxRingSize = 64 << 20
		c.Limits.MaxNameLen = 100
		c.Limits.MaxNDim = 8
		c.ShutdownTimeout = time.Second
		c.Upload.PartSize = 16 << 20
		c.Upload.Concurrency = 4
		return c
	}
	tests := []struct {
		name    string
		mut     func(c *serveConfig)
		wantSub string
	}{
		{"ok", func(*serveConfig) {}, ""},
		{"memory", func(c *serveConfig) { c.Memory.Limit = 10 }, "--memory-limit"},
		{"workers", func(c *serveConfig) { c.Pipeline.Workers = -1 }, "--workers"},
		{"sessions", func(c *serveConfig) { c.Limits.MaxSessions = 0 }, "--max-sessions"},
		{"ring", func(c *serveConfig) { c.Limits.MaxRingSize = 100 }, "--max-ring-size"},
		{"ndim", func(c *serveConfig) { c.Limits.MaxNDim = 9 }, "--max-ndim"},
		{"name", func(c *serveConfig) { c.Limits.MaxNameLen = 5000 }, "--max-name-len"},
		{"delay", func(c *serveConfig) { c.Debug.WriteDelay = -1 }, "--debug-write-delay"},
		{"cpu unlimited", func(c *serveConfig) { c.Pipeline.CPUBudget = -1 }, ""},
		{"cpu none", func(c *serveConfig) { c.Pipeline.CPUBudget = 0 }, ""},
		{"cpu too many", func(c *serveConfig) { c.Pipeline.CPUBudget = 2000 }, "--cpu-budget"},
		{"cpu NaN", func(c *serveConfig) { c.Pipeline.CPUBudget = math.NaN() }, "--cpu-budget"},
		{"http ok", func(c *serveConfig) { c.HTTP = httpConfig{Addr: "127.0.0.1:9464", MaxFollowers: 64} }, ""},
		{"http no port", func(c *serveConfig) { c.HTTP = httpConfig{Addr: "127.0.0.1", MaxFollowers: 64} }, "want host:port"},
		{"http bad port", func(c *serveConfig) { c.HTTP = httpConfig{Addr: "127.0.0.1:http", MaxFollowers: 64} }, "is not a number"},
		{"http no host", func(c *serveConfig) { c.HTTP = httpConfig{Addr: ":9464", MaxFollowers: 64} }, "name the address"},
		{"http relative socket", func(c *serveConfig) {
			c.HTTP = httpConfig{Addr: "127.0.0.1:1", APISocket: "api.sock", MaxFollowers: 64}
		}, "--http-api-socket"},
		{"http followers", func(c *serveConfig) { c.HTTP = httpConfig{Addr: "127.0.0.1:1"} }, "--http-max-followers"},
		{"detail without http", func(c *serveConfig) { c.HTTP = httpConfig{MetricsDetail: true} }, "need --http"},
		{"upload ok", func(c *serveConfig) { c.Upload.Target = "s3://caps/run" }, ""},
		{"upload not s3", func(c *serveConfig) { c.Upload.Target = "caps/run" }, "--upload"},
		{"upload bucket", func(c *serveConfig) { c.Upload.Target = "s3://Caps" }, "bucket name"},
		{"upload allow", func(c *serveConfig) { c.Upload.Allow = []string{"gs://x"} }, "--upload-allow"},
		{"upload part size", func(c *serveConfig) { c.Upload.PartSize = 1 << 20 }, "--upload-part-size"},
		{"upload concurrency", func(c *serveConfig) { c.Upload.Concurrency = 0 }, "--upload-concurrency"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mut(&c)
			err := c.validate()
			if tc.wantSub == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %v, want %q", err, tc.wantSub)
			}
		})
	}
}

// TestBinaryEndToEnd builds strapd, runs `strapd serve` as its own process, captures
// through it with the Go client, checks `strapd status`, and stops it with SIGTERM.
func TestBinaryEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "strapd")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir, err := os.MkdirTemp("", "strapd-e2e")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "sub", "strapd.sock")
	var stderr bytes.Buffer
	srv := exec.Command(bin, "serve", "--socket", sock, "--memory-limit", "256MiB", "--workers", "2")
	srv.Stderr = &stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	defer func() {
		if srv.ProcessState == nil {
			srv.Process.Kill()
			<-exited
		}
	}()

	// The Python client waits by polling connect; do the same.
	var c *control.Client
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err = control.Dial(ctx, sock, "e2e")
		cancel()
		if err == nil {
			break
		}
		if i == 200 {
			t.Fatalf("daemon not answering after 10s: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer c.Disconnect()

	// A second daemon on the same socket (two clients autostarting at once) leaves
	// quietly: status 0 and one log line naming the live daemon's pid; the default socket
	// group's warning (no "strap" group here) is not for a daemon that lost. Its
	// upload state directory holds an unfinished upload: the loser must leave it to the
	// live daemon (it took it up, and said so, before it knew it had lost).
	states := t.TempDir()
	pending, err := os.ReadFile(filepath.Join("..", "..", "internal", "upload", "testdata", "state", "two-parts.json"))
	if err != nil {
		t.Fatal(err)
	}
	statePath := filepath.Join(states, "upload-0123456789abcdef.json")
	if err := os.WriteFile(statePath, pending, 0o600); err != nil {
		t.Fatal(err)
	}
	second := exec.Command(bin, "serve", "--socket", sock, "--upload-state-dir", states)
	out, err := second.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(lines) != 1 {
		t.Fatalf("second daemon: %v, want status 0 and one log line:\n%s", err, out)
	}
	var line struct {
		Level, Msg, Socket string
		PID                int
	}
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatalf("second daemon's line: %v\n%s", err, out)
	}
	if line.Level != "info" || !strings.Contains(line.Msg, "another strapd serves on this socket") ||
		line.Socket != sock || line.PID != srv.Process.Pid {
		t.Fatalf("second daemon's line %+v, want info naming %s and pid %d", line, sock, srv.Process.Pid)
	}
	if after, err := os.ReadFile(statePath); err != nil || !bytes.Equal(after, pending) {
		t.Fatalf("the losing daemon touched the live one's upload state: %v", err)
	}

	outPath := filepath.Join(t.TempDir(), "capture.strap")
	of, err := os.OpenFile(outPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer of.Close()
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+1<<20, of, control.Open{Codec: "zstd", Policy: "block",
		Metadata: map[string]any{"model_class": "E2E", "output_path": outPath}})
	if err != nil {
		t.Fatal(err)
	}
	var sent [][]byte
	for i := range 8 {
		p := pipelinetest.Activations(uint64(i), 100000)
		tn := shm.Tensor{Name: "model.layers.0.mlp", DType: dtype.Float32, Shape: []uint64{1000, 100}, Step: uint64(i), Payload: p}
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, p)
	}

	// strapd status while the session is open.
	statusOut, err := exec.Command(bin, "status", "--json", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var rep control.StatusReply
	if err := json.Unmarshal(statusOut, &rep); err != nil {
		t.Fatalf("status json: %v\n%s", err, statusOut)
	}
	if rep.Daemon.Sessions != 1 || len(rep.Sessions) != 1 || rep.Sessions[0].ModelClass != "E2E" || rep.Daemon.Socket != sock {
		t.Fatalf("status %s", statusOut)
	}
	human, err := exec.Command(bin, "status", "--socket", sock).Output()
	if err != nil || !strings.Contains(string(human), "E2E") || !strings.Contains(string(human), "zstd") {
		t.Fatalf("status: %v\n%s", err, human)
	}

	cl, err := st.Finish()
	if err != nil {
		t.Fatal(err)
	}
	s, err := pipelinetest.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Tensors()
	if err != nil || len(got) != len(sent) || s.EndStatus() != "complete" || cl.FileBytes != uint64(fileLen(t, outPath)) {
		t.Fatalf("stream: %v, %d tensors, end %q, closed %+v", err, len(got), s.EndStatus(), cl)
	}
	for i := range sent {
		if err := pipelinetest.Equal(got[i].Payload, sent[i]); err != nil {
			t.Fatalf("tensor %d: %v", i, err)
		}
	}

	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("strapd exited with %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("strapd did not exit on SIGTERM")
	}
	if !strings.Contains(stderr.String(), `"serving"`) || !strings.Contains(stderr.String(), sock) {
		t.Fatalf("log lacks the serving line:\n%s", stderr.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

func fileLen(t *testing.T, p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
