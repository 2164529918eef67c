package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/trace"
)

func goldenSnapshot(t *testing.T) trace.Snapshot {
	t.Helper()
	f, err := os.Open("../../testdata/trace/snapshot.golden.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	sc.Scan()
	var s trace.Snapshot
	if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRenderTop(t *testing.T) {
	s := goldenSnapshot(t)
	v := &topView{cfg: topConfig{Syscalls: 5}}
	st := &topSessions{rep: control.StatusReply{
		Daemon:   control.DaemonStatus{Version: "9.9", PID: 77, Sessions: 1},
		Sessions: []control.SessionStatus{{Session: 3, PID: 4242, ModelClass: "GPT2LMHeadModel", InMBps: 1500, OutMBps: 500, Ratio: 3, Drops: 2, RingFill: 0.25}},
	}, tokensPer: map[uint64]float64{3: 12.5}}
	var b strings.Builder
	renderTop(&b, s, st, v, func(pid int) string { return "python" + strconv.Itoa(pid%10) }, 200)
	out := b.String()
	for _, want := range []string{
		"PSI (avg10)  cpu some 1.5% full 0.0%   io some 0.1% full 0.1%   memory some 0.0% full 0.0%",
		// 1 read (4 KiB) and 2 writes (128 KiB) over 5 s; 3 completions: p50 in 64–127 µs, p99 in 512–1023 µs.
		"vda              0.2      0.4      0.00      0.03    128µs   1024µs          0",
		// 300 ms asleep over 5 s; 5604 faults and 14 major over 5 s (rounded); 15 switches.
		"4242 python2                               0       60        0      1121      3    1.0GiB    4096µs    4096µs      3",
		"    futex                     1/s  p50    65ms  p99    65ms      40.0 ms/s  err 1",
		"    read                     20/s  p50     4µs  p99     4µs       0.0 ms/s  err 0",
		"SESSIONS  strapd 9.9 pid 77  1 live",
		"        3     4242  GPT2LMHeadModel         1.500     0.500   3.00x       2      12.5   25%",
		"PROBE DROPS  ringbuf_full 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("screen lacks %q:\n%s", want, out)
		}
	}
	// futex (200 ms) is listed before read (30 µs): by time spent.
	if strings.Index(out, "futex") > strings.Index(out, "    read") {
		t.Errorf("syscalls not ordered by time:\n%s", out)
	}
	b.Reset()
	v.daemonErr = "connect /x: no such file or directory"
	renderTop(&b, trace.Snapshot{}, nil, v, procComm, 80)
	for _, want := range []string{"(no completed requests)", "(no watched process", "SESSIONS  no daemon: connect /x"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("empty screen lacks %q:\n%s", want, b.String())
		}
	}
	for _, l := range strings.Split(b.String(), "\n") {
		if len([]rune(l)) > 80 {
			t.Errorf("line wider than 80: %q", l)
		}
	}
}

func TestQuantileUs(t *testing.T) {
	bk := func(slot int, n uint64) trace.Bucket {
		return trace.Bucket{Slot: slot, Count: n, BucketLow: (1 << slot) >> 1, BucketHigh: 1<<slot - 1}
	}
	for _, tc := range []struct {
		name string
		b    []trace.Bucket
		q    float64
		want int64
	}{
		{"empty", nil, 0.5, -1},
		{"one bucket", []trace.Bucket{bk(3, 5)}, 0.99, 8},
		{"median in first", []trace.Bucket{bk(1, 6), bk(10, 4)}, 0.5, 2},
		{"p99 in last", []trace.Bucket{bk(1, 6), bk(10, 4)}, 0.99, 1024},
		{"zero-µs slot", []trace.Bucket{bk(0, 1)}, 0.5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := quantileUs(tc.b, tc.q); got != tc.want {
				t.Fatalf("quantileUs = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestTopInTmux runs `strapd top` in a real terminal (tmux) beside a real daemon with a
// live session that sends tokens, reads the screen and quits with q.
func TestTopInTmux(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: the probes need root")
	}
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("skipping: tmux not installed (Debian: apt-get install -y tmux)")
	}
	bin := strapdBinary(t)
	dir := shortDir(t)
	sock := filepath.Join(dir, "s.sock")
	srv := exec.Command(bin, "serve", "--socket", sock, "--memory-limit", "256MiB", "--workers", "2", "--no-probes")
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })

	var c *control.Client
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err = control.Dial(ctx, sock, "top-test")
		cancel()
		if err == nil {
			break
		}
		if i == 200 {
			t.Fatalf("daemon not answering: %v\n%s", err, srvErr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer c.Disconnect()
	of, err := os.Create(filepath.Join(dir, "cap.strap"))
	if err != nil {
		t.Fatal(err)
	}
	defer of.Close()
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+1<<20, of, control.Open{Codec: "zstd", Policy: "block",
		Metadata: map[string]any{"model_class": "TopTestModel"}})
	if err != nil {
		t.Fatal(err)
	}
	tn := shm.Tensor{Name: "h", DType: dtype.Float32, Shape: []uint64{1024}, Payload: make([]byte, 4096)}
	if err := st.Put(&tn); err != nil {
		t.Fatal(err)
	}
	// Tokens at about 50/s for as long as the test runs.
	var stopTokens atomic.Bool
	tokErr := make(chan error, 1)
	go func() {
		for i := uint64(0); !stopTokens.Load(); i++ {
			if err := c.Conn().Send(control.TypeToken, control.Token{Seq: st.P.TakeSeq(), Index: i, TokenID: int64(i), Text: "t"}); err != nil {
				tokErr <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		tokErr <- nil
	}()
	var stopOnce sync.Once
	stopSending := func() {
		stopOnce.Do(func() {
			stopTokens.Store(true)
			if err := <-tokErr; err != nil {
				t.Errorf("sending tokens: %v", err)
			}
		})
	}
	defer stopSending()

	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })

	srvName := "strapd-top-test-" + strconv.Itoa(os.Getpid())
	tm := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-L", srvName}, args...)...).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { tm("kill-server") })
	cmdline := bin + " top --socket " + sock + " --interval 0.5 --pid " + strconv.Itoa(sleeper.Process.Pid) + " --log-level error; sleep 30"
	if out, err := tm("new-session", "-d", "-s", "top", "-x", "160", "-y", "60", cmdline); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}

	sessionRow := regexp.MustCompile(`(?m)^\s+\d+\s+` + strconv.Itoa(os.Getpid()) + `\s+TopTestModel\s+[\d.]+\s+[\d.]+\s+\S+\s+0\s+([\d.]+)\s+\d+%`)
	var screen string
	deadline := time.Now().Add(15 * time.Second)
	for {
		screen, err = tm("capture-pane", "-p", "-t", "top")
		if err != nil {
			t.Fatalf("capture-pane: %v\n%s", err, screen)
		}
		if m := sessionRow.FindStringSubmatch(screen); m != nil {
			if r, _ := strconv.ParseFloat(m[1], 64); r > 10 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session row with tokens/s > 10 after 15s:\n%s", screen)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("screen:\n%s", screen)
	for _, want := range []string{"strapd top", "PSI (avg10)", "DISK", "PROCESS", "RUNQ p99",
		strconv.Itoa(sleeper.Process.Pid) + " sleep",
		"SESSIONS  strapd", "TOKENS/s"} {
		if !strings.Contains(screen, want) {
			t.Errorf("screen lacks %q:\n%s", want, screen)
		}
	}
	// The session's client (this test) is watched once the daemon names it.
	if !regexp.MustCompile(`(?m)^` + strconv.Itoa(os.Getpid()) + ` \S+\s+\d+`).MatchString(screen) {
		t.Errorf("session client %d not among the processes:\n%s", os.Getpid(), screen)
	}
	// The test process sleeps between tokens: its nanosleep is among its syscalls.
	if !regexp.MustCompile(`(?m)^\s+(clock_nanosleep|nanosleep|futex)\s+\d+/s\s+p50`).MatchString(screen) {
		t.Errorf("no syscall line for the session client:\n%s", screen)
	}

	if out, err := tm("send-keys", "-t", "top", "q"); err != nil {
		t.Fatalf("send-keys: %v\n%s", err, out)
	}
	// After q, top leaves the alternate screen and the shell runs `sleep 30`: the pane's
	// command is no longer strapd.
	deadline = time.Now().Add(5 * time.Second)
	for {
		cur, err := tm("display-message", "-p", "-t", "top", "#{pane_current_command}")
		if err != nil {
			t.Fatalf("display-message: %v\n%s", err, cur)
		}
		if strings.TrimSpace(cur) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("top still running 5s after q (pane runs %q)", strings.TrimSpace(cur))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopSending()
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
}
