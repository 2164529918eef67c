//go:build privileged

package server

// Tests that need root (`make test-privileged` builds them with -tags privileged): they
// give the socket another group and run a client as another uid.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

func TestSocketPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving the socket another group needs root")
	}
	ts := startServer(t, Config{Access: Access{SocketMode: 0o660, SocketGID: 65534}})
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{ts.sock, 0o660}, {filepath.Dir(ts.sock), 0o750}} {
		var st unix.Stat_t
		if err := unix.Stat(c.path, &st); err != nil {
			t.Fatal(err)
		}
		if os.FileMode(st.Mode).Perm() != c.mode || st.Gid != 65534 {
			t.Fatalf("%s: mode %o gid %d, want %o gid 65534", c.path, st.Mode&0o777, st.Gid, c.mode)
		}
	}
}

// Environment of the unprivileged helper process (TestHelperUnprivilegedClient).
// TestRootDaemonUnprivilegedClient: a daemon running as root, a client running as
// nobody (uid 65534). The client tries to make the daemon write a root-owned file it cannot
// write itself (read-only fd, directory, O_PATH fd, socket, a path label); every attempt
// fails and the file is untouched. The client's own capture works, STATUS shows it only
// its own sessions, a uid outside the socket's group cannot connect, and an allow-list
// refuses it with access_denied.
func TestRootDaemonUnprivilegedClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the daemon runs as root and the client as uid 65534")
	}
	base, err := os.MkdirTemp("", "strapd-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	// The victim: root's file in root's directory, world-readable, writable by root only.
	victimDir := filepath.Join(base, "root-only")
	if err := os.Mkdir(victimDir, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(victimDir, "precious")
	content := []byte("root's data, not to be overwritten\n")
	if err := os.WriteFile(victim, content, 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(victim, old, old); err != nil {
		t.Fatal(err)
	}
	ownDir := filepath.Join(base, "nobody")
	if err := os.Mkdir(ownDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ownDir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(base, "helper.test")
	copyExecutable(t, helper)

	// Sockets in base/run (group nogroup, 0750) and base/denied.
	ts := startServerAt(t, filepath.Join(base, "run", "s.sock"), Config{Access: Access{SocketMode: 0o660, SocketGID: 65534}})
	denied := startServerAt(t, filepath.Join(base, "denied", "s.sock"),
		Config{Access: Access{SocketMode: 0o660, SocketGID: 65534, AllowUIDs: []uint32{4242}}})

	// Root holds a session while the helper asks for STATUS.
	rc := ts.dial(t)
	rootStream, _, err := controltest.OpenStream(rc, shm.HeaderSize+64<<10, outFile(t), control.Open{Codec: "none", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	defer rootStream.Finish()

	run := func(uid, gid uint32) map[string]helperResult {
		cmd := exec.Command(helper, "-test.run=^TestHelperUnprivilegedClient$", "-test.count=1")
		cmd.Env = []string{envHelper + "=1", envSock + "=" + ts.sock, envDeniedSock + "=" + denied.sock,
			envVictim + "=" + victim, envOwnDir + "=" + ownDir, "PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("helper as uid %d: %v\nstdout:\n%s\nstderr:\n%s", uid, err, stdout.String(), stderr.String())
		}
		res := map[string]helperResult{}
		sc := bufio.NewScanner(&stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), helperResultLn); ok {
				var r helperResult
				if err := json.Unmarshal([]byte(line), &r); err != nil {
					t.Fatalf("helper line %q: %v", line, err)
				}
				res[r.Attempt] = r
			}
		}
		t.Logf("helper as uid %d: %+v", uid, res)
		return res
	}

	res := run(65534, 65534)
	if r := res["open victim for writing"]; !strings.Contains(r.Err, "permission denied") {
		t.Errorf("the client itself could open the victim for writing: %+v", r)
	}
	for _, a := range []string{"victim read-only", "victim O_PATH", "victim's directory", "socket"} {
		if r, ok := res[a]; !ok || r.Code != control.CodeBadOutput {
			t.Errorf("%s: %+v, want bad_output", a, r)
		}
	}
	if r := res["status"]; r.Err != "" || r.Visible != 0 || r.Sessions < 1 {
		t.Errorf("status as nobody: %+v, want root's session counted but not listed", r)
	}
	if r := res["allow-list"]; r.Code != CodeAccessDenied {
		t.Errorf("allow-list: %+v, want access_denied", r)
	}
	if r := res["own capture"]; r.Err != "" {
		t.Fatalf("own capture: %+v", r)
	}
	// The victim is untouched and nothing was created at the label path.
	got, err := os.ReadFile(victim)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("victim changed: %q %v", got, err)
	}
	if fi, err := os.Stat(victim); err != nil || !fi.ModTime().Equal(old) {
		t.Fatalf("victim touched: %v %v", fi.ModTime(), err)
	}
	if _, err := os.Stat(filepath.Join(victimDir, "label.strap")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the daemon created the labelled path: %v", err)
	}
	// The client's own file holds its capture, with the kernel's idea of who it is.
	s, err := pipelinetest.ReadFile(filepath.Join(ownDir, "own.strap"))
	if err != nil || s.EndStatus() != "complete" || len(s.Packets) != 3 {
		t.Fatalf("own capture: %v", err)
	}
	if peer, _ := s.Meta["peer"].(map[string]any); peer["uid"] != float64(65534) || peer["gid"] != float64(65534) {
		t.Fatalf("stream peer %v", s.Meta["peer"])
	}

	// A uid outside the socket's group cannot even connect.
	res = run(65533, 65533)
	if r := res["connect"]; !strings.Contains(r.Err, "permission denied") {
		t.Fatalf("outsider connect: %+v, want permission denied", r)
	}
}
