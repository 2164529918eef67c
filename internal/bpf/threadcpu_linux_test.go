//go:build linux

package bpf

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// namedSpinner names a thread "spin-worker", makes it spin 0.5 s of CPU after "go" and
// then wait (alive) for the next line; the main thread sleeps meanwhile.
const namedSpinner = `import ctypes, sys, threading, time
libc = ctypes.CDLL(None)
def spin():
    libc.prctl(15, b"spin-worker", 0, 0, 0)
    ready.set()
    go.wait()
    end = time.thread_time() + 0.5
    while time.thread_time() < end:
        pass
    spun.set()
    stop.wait()
ready, go, spun, stop = threading.Event(), threading.Event(), threading.Event(), threading.Event()
t = threading.Thread(target=spin)
t.start()
ready.wait()
print("ready", flush=True)
sys.stdin.readline()
go.set()
spun.wait()
print("done", flush=True)
sys.stdin.readline()
stop.set()
t.join()
`

func TestThreadCPUByName(t *testing.T) {
	py := python(t)
	c, err := Start(Options{NoBPF: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := exec.Command(py, "-c", namedSpinner)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	out := bufio.NewScanner(outp)
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("child: %q", out.Text())
	}
	if err := c.Watch(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	key := strconv.Itoa(cmd.Process.Pid)
	if first := c.Snapshot(); first.ThreadCPU[key] != nil {
		t.Fatalf("first reading must be the baseline only, got %+v", first.ThreadCPU[key])
	}
	in.Write([]byte("go\n"))
	if !out.Scan() || out.Text() != "done" {
		t.Fatalf("child: %q", out.Text())
	}
	s := c.Snapshot()
	got := s.ThreadCPU[key]
	t.Logf("thread_cpu %+v", got)
	main, ok := got["python3"]
	if !ok {
		for name := range got {
			if name != "spin-worker" {
				main, ok = got[name], true
			}
		}
	}
	if !ok || main.Threads != 1 || main.CPUNs > 200e6 {
		t.Fatalf("main thread %+v: want one thread, asleep (< 200 ms CPU)", main)
	}
	if w := got["spin-worker"]; w.Threads != 1 || w.CPUNs < 450e6 || w.CPUNs > 2e9 {
		t.Fatalf("spin-worker %+v: want one thread with about 500 ms of CPU", w)
	}
}
