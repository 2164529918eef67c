package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

// strapdBinary builds strapd once for this package's deployment tests.
func strapdBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "strapd-deploy-bin")
		if buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "strapd")
		out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// shortDir is a temp dir with a short path (socket paths are limited to 108 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// notifyListener is a NOTIFY_SOCKET as systemd provides it: it collects the datagrams.
type notifyListener struct {
	path string
	ch   chan string
	conn *net.UnixConn
}

func listenNotify(t *testing.T, dir string) *notifyListener {
	t.Helper()
	path := filepath.Join(dir, "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifyListener{path: path, ch: make(chan string, 64), conn: c}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				close(n.ch)
				return
			}
			n.ch <- string(buf[:k])
		}
	}()
	t.Cleanup(func() { c.Close() })
	return n
}

// wait returns the datagrams received until one contains want.
func (n *notifyListener) wait(t *testing.T, want string, timeout time.Duration) []string {
	t.Helper()
	var got []string
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-n.ch:
			if !ok {
				t.Fatalf("notify socket closed before %q; got %q", want, got)
			}
			got = append(got, m)
			if strings.Contains(m, want) {
				return got
			}
		case <-deadline:
			t.Fatalf("no %q from sd_notify in %v; got %q", want, timeout, got)
		}
	}
}

// daemon is a running strapd process.
type daemon struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	exited chan error
}

func (d *daemon) stop(t *testing.T, sig os.Signal, timeout time.Duration) error {
	t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.exited:
		return err
	case <-time.After(timeout):
		d.cmd.Process.Kill()
		<-d.exited
		t.Fatalf("strapd did not exit %v after %v\n%s", sig, timeout, d.stderr.String())
	}
	return nil
}

func startDaemon(t *testing.T, cmd *exec.Cmd) *daemon {
	t.Helper()
	d := &daemon{cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-d.exited
		}
	})
	return d
}

// activated starts strapd the way strapd.service does under strapd.socket: the listening
// socket inherited as fd 3 with LISTEN_FDS=1 and LISTEN_PID set to strapd's own pid (the
// shell's pid, which exec keeps), and NOTIFY_SOCKET for sd_notify.
func activated(t *testing.T, bin string, ln *os.File, notify string, args ...string) *daemon {
	t.Helper()
	sh := exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@"`, bin, "serve"}, args...)...)
	sh.ExtraFiles = []*os.File{ln}
	sh.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify)
	return startDaemon(t, sh)
}

func dialRetry(t *testing.T, sock string) *control.Client {
	t.Helper()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := control.Dial(ctx, sock, "deploy-test")
		cancel()
		if err == nil {
			t.Cleanup(func() { c.Disconnect() })
			return c
		}
		if i == 100 {
			t.Fatalf("daemon not answering on %s: %v", sock, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSocketActivation starts strapd as strapd.service does (inherited listening socket,
// notify socket), checks STATUS lines and READY=1 arrive, a session works through the
// inherited socket, SIGTERM brings STOPPING=1 and exit 0, and the socket file (systemd's)
// is left in place. Two launchers: a shell that sets LISTEN_PID to its own pid and execs
// strapd, and systemd's own systemd-socket-activate where it is installed.
func TestSocketActivation(t *testing.T) {
	bin := strapdBinary(t)
	launchers := []struct {
		name  string
		start func(t *testing.T, sock, notify string, args ...string) *daemon
	}{
		{"sh exec with fd 3", func(t *testing.T, sock, notify string, args ...string) *daemon {
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			f, err := ln.File()
			if err != nil {
				t.Fatal(err)
			}
			ln.Close() // the dup in f keeps the socket listening
			defer f.Close()
			return activated(t, bin, f, notify, args...)
		}},
		{"systemd-socket-activate", func(t *testing.T, sock, notify string, args ...string) *daemon {
			ssa, err := exec.LookPath("systemd-socket-activate")
			if err != nil {
				t.Skip("systemd-socket-activate not installed (Debian package systemd)")
			}
			// It execs strapd on the first connection, passing the listener.
			return startDaemon(t, exec.Command(ssa, append([]string{"--seqpacket", "-l", sock, "-E", "NOTIFY_SOCKET=" + notify,
				bin, "serve"}, args...)...))
		}},
	}
	for _, l := range launchers {
		t.Run(l.name, func(t *testing.T) {
			dir := shortDir(t)
			sock := filepath.Join(dir, "strapd.sock")
			n := listenNotify(t, dir)
			// --socket names a path nobody listens on: the inherited socket must win.
			d := l.start(t, sock, n.path, "--socket", filepath.Join(dir, "unused.sock"), "--workers", "1", "--memory-limit", "64MiB")
			c := dialRetry(t, sock)
			got := n.wait(t, "READY=1", 20*time.Second)
			if !strings.Contains(strings.Join(got, "|"), "STATUS=starting") || !strings.Contains(got[len(got)-1], "STATUS=serving on "+sock) {
				t.Fatalf("sd_notify sequence %q", got)
			}
			if _, err := os.Stat(filepath.Join(dir, "unused.sock")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("strapd created its own socket beside the inherited one: %v", err)
			}
			out := filepath.Join(dir, "cap.strap")
			sent := captureSome(t, c, out, 5, true)
			s, err := pipelinetest.ReadFile(out)
			if err != nil || s.EndStatus() != "complete" || len(s.Packets) != len(sent) {
				t.Fatalf("stream through the inherited socket: %v", err)
			}
			rep, err := dialRetry(t, sock).Status()
			if err != nil || rep.Daemon.Socket != sock {
				t.Fatalf("status: %v, socket %q", err, rep.Daemon.Socket)
			}
			if err := d.stop(t, syscall.SIGTERM, 20*time.Second); err != nil {
				t.Fatalf("exit after SIGTERM: %v\n%s", err, d.stderr.String())
			}
			n.wait(t, "STOPPING=1", 5*time.Second)
			if !strings.Contains(d.stderr.String(), `"socket_activated":true`) {
				t.Fatalf("log does not say socket-activated:\n%s", d.stderr.String())
			}
			if l.name == "sh exec with fd 3" {
				if _, err := os.Stat(sock); err != nil {
					t.Fatalf("the inherited socket file was removed: %v", err)
				}
			}
		})
	}
}

// TestSocketActivationRefusesWrongSocket: an inherited stream socket is not the control
// socket; strapd says so and exits non-zero instead of serving the wrong protocol.
func TestSocketActivationRefusesWrongSocket(t *testing.T) {
	bin := strapdBinary(t)
	dir := shortDir(t)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "stream.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := listenNotify(t, dir)
	d := activated(t, bin, f, n.path, "--socket", filepath.Join(dir, "unused.sock"))
	select {
	case err := <-d.exited:
		if err == nil || !strings.Contains(d.stderr.String(), "SOCK_SEQPACKET") {
			t.Fatalf("exit %v\n%s", err, d.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("strapd kept running on a stream socket")
	}
}

// captureSome streams count tensors to out through c; with finish it closes the session.
func captureSome(t *testing.T, c *control.Client, out string, count int, finish bool) []shm.Tensor {
	t.Helper()
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+256<<10, f, control.Open{Codec: "zstd", Policy: "block",
		Metadata: map[string]any{"model_class": "Deploy", "output_path": out}})
	if err != nil {
		t.Fatal(err)
	}
	var sent []shm.Tensor
	for i := range count {
		tn := shm.Tensor{Name: fmt.Sprintf("model.layers.%d.mlp", i), DType: dtype.Float32, Shape: []uint64{50, 100},
			Step: uint64(i), Payload: pipelinetest.Activations(uint64(i+1), 5000)}
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, tn)
	}
	if finish {
		if _, err := st.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	return sent
}

// TestSIGTERMDrainsLiveSessions: SIGTERM during three live captures (checkpointed, then
// more records published, no CLOSE) writes everything published, ends each stream (END
// aborted, index, footer, fdatasync), tells each client, and exits 0; every file passes
// `strapd verify` and holds the published tensors bit-exact. Then each capture resumes from
// its checkpoint on a new daemon and finishes complete.
func TestSIGTERMDrainsLiveSessions(t *testing.T) {
	bin := strapdBinary(t)
	dir := shortDir(t)
	sock := filepath.Join(dir, "s.sock")
	serve := func() *daemon {
		return startDaemon(t, exec.Command(bin, "serve", "--socket", sock, "--workers", "2", "--memory-limit", "256MiB",
			"--shutdown-timeout", "10s", "--debug-write-delay", "2ms"))
	}
	d := serve()
	req := control.Open{Codec: "zstd", Policy: "block", Metadata: map[string]any{"model_class": "Deploy"}}
	type live struct {
		c    *control.Client
		out  string
		ck   control.Checkpointed
		sent []shm.Tensor
	}
	put := func(st *controltest.Stream, sent []shm.Tensor, from, n int) []shm.Tensor {
		for i := from; i < from+n; i++ {
			tn := shm.Tensor{Name: fmt.Sprintf("model.layers.%d.mlp", i%4), DType: dtype.Float32, Shape: []uint64{50, 100},
				Step: uint64(i), Payload: pipelinetest.Activations(uint64(i+1), 5000)}
			if err := st.Put(&tn); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, tn)
		}
		return sent
	}
	var sessions []*live
	for i := range 3 {
		l := &live{c: dialRetry(t, sock), out: filepath.Join(dir, fmt.Sprintf("live%d.strap", i))}
		f, err := os.OpenFile(l.out, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		st, _, err := controltest.OpenStream(l.c, shm.HeaderSize+256<<10, f, req)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		l.sent = put(st, nil, 0, 6+2*i)
		if l.ck, err = l.c.Checkpoint(st.P.LastSeq()); err != nil {
			t.Fatal(err)
		}
		l.sent = put(st, l.sent, len(l.sent), 6) // published after the checkpoint
		sessions = append(sessions, l)
	}
	start := time.Now()
	if err := d.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, d.stderr.String())
	}
	t.Logf("drained 3 live sessions and exited in %v", time.Since(start).Round(time.Millisecond))
	for i, s := range sessions {
		_ = s.c.Conn().Unix().SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := s.c.WaitRelease(1 << 60)
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeShutdown {
			t.Errorf("session %d: client got %v, want ERROR shutdown", i, err)
		}
		checkFile(t, bin, s.out, s.sent, "aborted")
	}

	// Resume each capture from its checkpoint on a new daemon: the records published after
	// the checkpoint and the END are cut, new records follow.
	d = serve()
	for i, s := range sessions {
		f, err := os.OpenFile(s.out, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		r := req
		r.AppendAt, r.Resume = s.ck.Offset, &control.Resume{LastSeq: s.ck.Seq, LastCRC: s.ck.LastCRC, Packets: s.ck.Packets}
		st, _, err := controltest.OpenStream(dialRetry(t, sock), shm.HeaderSize+256<<10, f, r)
		f.Close()
		if err != nil {
			t.Fatalf("session %d: resume: %v", i, err)
		}
		for range s.ck.Seq {
			st.P.TakeSeq()
		}
		kept := s.sent[:s.ck.Seq]
		kept = put(st, append([]shm.Tensor(nil), kept...), 100, 3)
		if _, err := st.Finish(); err != nil {
			t.Fatalf("session %d: close resumed: %v", i, err)
		}
		checkFile(t, bin, s.out, kept, "complete")
	}
	if err := d.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("second daemon: %v\n%s", err, d.stderr.String())
	}
}

// checkFile checks a stream with `strapd verify` and reads back its tensors bit-exact.
func checkFile(t *testing.T, bin, path string, sent []shm.Tensor, end string) {
	t.Helper()
	if out, err := exec.Command(bin, "verify", path).CombinedOutput(); err != nil {
		t.Fatalf("%s: strapd verify: %v\n%s", path, err, out)
	}
	st, err := pipelinetest.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	got, err := st.Tensors()
	if err != nil || st.EndStatus() != end || !st.Footer || len(got) != len(sent) {
		t.Fatalf("%s: end %q (want %q) footer %v, %d of %d tensors: %v", path, st.EndStatus(), end, st.Footer, len(got), len(sent), err)
	}
	for j := range sent {
		if got[j].Name != sent[j].Name || got[j].Step != sent[j].Step {
			t.Fatalf("%s tensor %d: %s step %d, want %s step %d", path, j, got[j].Name, got[j].Step, sent[j].Name, sent[j].Step)
		}
		if err := pipelinetest.Equal(got[j].Payload, sent[j].Payload); err != nil {
			t.Fatalf("%s tensor %d: %v", path, j, err)
		}
	}
}

// TestSIGHUPReopensLogFile: after the log file is moved away (as logrotate does), SIGHUP
// makes strapd write to a new file at the same path; the daemon keeps serving.
func TestSIGHUPReopensLogFile(t *testing.T) {
	bin := strapdBinary(t)
	dir := shortDir(t)
	sock := filepath.Join(dir, "s.sock")
	logPath := filepath.Join(dir, "strapd.log")
	d := startDaemon(t, exec.Command(bin, "serve", "--socket", sock, "--workers", "1", "--log-file", logPath))
	dialRetry(t, sock).Disconnect()
	waitFile(t, logPath, `"serving"`)
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFile(t, logPath, "log file reopened")
	c := dialRetry(t, sock)
	captureSome(t, c, filepath.Join(dir, "after-hup.strap"), 2, true)
	waitFile(t, logPath, "session finished")
	if err := d.stop(t, syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.stderr.String())
	}
	old, _ := os.ReadFile(logPath + ".1")
	if bytes.Contains(old, []byte("session finished")) {
		t.Fatal("lines after SIGHUP went to the rotated file")
	}
	if d.stderr.Len() != 0 {
		t.Fatalf("with --log-file nothing goes to stderr; got:\n%s", d.stderr.String())
	}
}

func waitFile(t *testing.T, path, want string) {
	t.Helper()
	for range 200 {
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(want)) {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	b, _ := os.ReadFile(path)
	t.Fatalf("%s lacks %q:\n%s", path, want, b)
}

// TestInstallAndVerifyUnits: `make install` honours DESTDIR and PREFIX; the installed
// units pass `systemd-analyze verify` and the service's `systemd-analyze security`
// exposure is at most 3.0 (docs/DEPLOY.md); `make uninstall` removes every file.
func TestInstallAndVerifyUnits(t *testing.T) {
	bin := strapdBinary(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	dest := t.TempDir()
	const prefix = "/opt/strap"
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// BIN points at the binary built above, newer than every source: make does not rebuild.
	mk := func(target string) {
		out, err := exec.Command("make", "-s", "-C", root, target, "DESTDIR="+dest, "PREFIX="+prefix, "BIN="+bin).CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}
	mk("install")
	files := []string{"bin/strapd", "lib/systemd/system/strapd.service", "lib/systemd/system/strapd.socket",
		"lib/sysusers.d/strapd.conf", "lib/tmpfiles.d/strapd.conf"}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dest, prefix, f)); err != nil {
			t.Fatalf("not installed: %v", err)
		}
	}
	unitDir := filepath.Join(dest, prefix, "lib/systemd/system")
	svc, err := os.ReadFile(filepath.Join(unitDir, "strapd.service"))
	if err != nil || !bytes.Contains(svc, []byte("ExecStart="+prefix+"/bin/strapd serve")) || bytes.Contains(svc, []byte("@BINDIR@")) {
		t.Fatalf("installed unit's ExecStart: %v\n%s", err, svc)
	}

	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not installed (Debian package systemd): units not verified")
	} else {
		// Verify the units as installed, with ExecStart pointing at the staged binary
		// (verify checks the executable exists).
		vdir := t.TempDir()
		staged := bytes.ReplaceAll(svc, []byte(prefix+"/bin/strapd"), []byte(filepath.Join(dest, prefix, "bin/strapd")))
		if err := os.WriteFile(filepath.Join(vdir, "strapd.service"), staged, 0o644); err != nil {
			t.Fatal(err)
		}
		sockUnit, _ := os.ReadFile(filepath.Join(unitDir, "strapd.socket"))
		if err := os.WriteFile(filepath.Join(vdir, "strapd.socket"), sockUnit, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("systemd-analyze", "verify", "--man=no", filepath.Join(vdir, "strapd.socket"), filepath.Join(vdir, "strapd.service"))
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
		}
		out, err := exec.Command("systemd-analyze", "security", "--offline=true", filepath.Join(vdir, "strapd.service")).CombinedOutput()
		if err != nil {
			t.Fatalf("systemd-analyze security: %v\n%s", err, out)
		}
		m := regexp.MustCompile(`Overall exposure level for strapd.service: ([0-9.]+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no exposure level in:\n%s", out)
		}
		score, _ := strconv.ParseFloat(string(m[1]), 64)
		t.Logf("systemd-analyze security exposure: %.1f", score)
		if score > 3.0 {
			t.Fatalf("exposure %.1f > 3.0:\n%s", score, out)
		}
	}

	mk("uninstall")
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dest, prefix, f)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("left behind by uninstall: %s (%v)", f, err)
		}
	}
}
