//go:build privileged

package httpapi

// Root-only (`make test-privileged` builds them with -tags privileged): requests made as
// other uids, files owned by another uid.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/strap-llm/strap/internal/control"
)

// dialAs connects to sock with the effective uid and gid of another user. Credentials
// are per thread in Linux: the raw syscalls change only a locked thread, which is
// discarded when its goroutine ends (it is never unlocked), so the test process keeps root.
func dialAs(sock string, uid, gid int) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			ch <- res{err: fmt.Errorf("setgroups: %w", e)}
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); e != 0 {
			ch <- res{err: fmt.Errorf("setresgid: %w", e)}
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			ch <- res{err: fmt.Errorf("setresuid: %w", e)}
			return
		}
		c, err := net.Dial("unix", sock)
		ch <- res{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// TestOtherUserSeesOnlyOwn: a peer that is not root, named by the kernel, sees only its
// own sessions and gets 404 for others'; a refused uid gets 403 on every endpoint.
func TestOtherUserSeesOnlyOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as other uids")
	}
	be := &fakeBackend{refuse: map[uint32]bool{4343: true}}
	be.set(control.SessionStatus{Session: 3, UID: 0, PID: 10}, control.SessionStatus{Session: 5, UID: 65534, PID: 11})
	a := startAPI(t, be, Options{})
	nobody := a.client(func() (net.Conn, error) { return dialAs(a.sock, 65534, 65534) })
	code, body := get(t, nobody, "/api/v1/sessions")
	var list SessionList
	if err := json.Unmarshal(body, &list); err != nil || code != 200 {
		t.Fatalf("sessions as nobody: %d %s %v", code, body, err)
	}
	if len(list.Sessions) != 1 || list.Sessions[0].Session != 5 || list.Hidden != 1 {
		t.Fatalf("nobody sees %+v", list)
	}
	if code, body := get(t, nobody, "/api/v1/sessions/3"); code != 404 {
		t.Fatalf("root's session as nobody: %d %s", code, body)
	}
	refused := a.client(func() (net.Conn, error) { return dialAs(a.sock, 4343, 4343) })
	for _, p := range []string{"/api/v1/status", "/api/v1/sessions/5", "/api/v1/resource-logs?follow=1"} {
		code, body := get(t, refused, p)
		if code != http.StatusForbidden || !strings.Contains(string(body), "access_denied") {
			t.Fatalf("%s as a refused uid: %d %s", p, code, body)
		}
	}
}

// TestResourceLogRefusesForeignFile: a session's output_path is the client's word, so a
// log owned by another uid, or a symlink, is not read.
func TestResourceLogRefusesForeignFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := t.TempDir()
	be := &fakeBackend{}
	victim := filepath.Join(dir, "secret")
	appendLine(t, victim, `{"event":"secret"}`+"\n")
	s := control.SessionStatus{Session: 1, UID: 1000, OutputPath: filepath.Join(dir, "a.strap")}
	if err := os.Symlink(victim, s.OutputPath+ResourceSuffix); err != nil {
		t.Fatal(err)
	}
	s2 := control.SessionStatus{Session: 2, UID: 1000, OutputPath: filepath.Join(dir, "b.strap")}
	appendLine(t, s2.OutputPath+ResourceSuffix, `{"event":"x"}`+"\n") // owned by root, not uid 1000
	be.set(s, s2)
	a := startAPI(t, be, Options{})
	code, body := get(t, a.client(nil), "/api/v1/resource-logs")
	if code != 200 || strings.Contains(string(body), "secret\"") || !strings.Contains(string(body), "owned by uid 0") ||
		!strings.Contains(string(body), "too many levels of symbolic links") {
		t.Fatalf("%d %s", code, body)
	}
}
