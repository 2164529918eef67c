package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/shm"
)

func TestAdmit(t *testing.T) {
	tests := []struct {
		name   string
		access Access
		cred   *unix.Ucred
		groups []uint32
		ok     bool
	}{
		{"no lists admit anyone", Access{}, &unix.Ucred{Uid: 1000, Gid: 1000}, nil, true},
		{"unknown peer is refused", Access{}, nil, nil, false},
		{"uid on the list", Access{AllowUIDs: []uint32{1000}}, &unix.Ucred{Uid: 1000, Gid: 1000}, nil, true},
		{"uid not on the list", Access{AllowUIDs: []uint32{1000}}, &unix.Ucred{Uid: 1001, Gid: 1001}, nil, false},
		{"root always", Access{AllowUIDs: []uint32{1000}}, &unix.Ucred{Uid: 0, Gid: 0}, nil, true},
		{"primary group on the list", Access{AllowGIDs: []uint32{50}}, &unix.Ucred{Uid: 1001, Gid: 50}, nil, true},
		{"supplementary group on the list", Access{AllowGIDs: []uint32{50}}, &unix.Ucred{Uid: 1001, Gid: 1001}, []uint32{7, 50}, true},
		{"no group on the list", Access{AllowGIDs: []uint32{50}}, &unix.Ucred{Uid: 1001, Gid: 1001}, []uint32{7}, false},
		{"either list admits", Access{AllowUIDs: []uint32{1}, AllowGIDs: []uint32{50}}, &unix.Ucred{Uid: 1, Gid: 9}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.access.admit(tc.cred, tc.groups)
			if (err == nil) != tc.ok {
				t.Fatalf("admit = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, errAccessDenied) {
				t.Fatalf("err %v is not errAccessDenied", err)
			}
		})
	}
}

func TestCanControl(t *testing.T) {
	tests := []struct {
		name  string
		peer  *unix.Ucred
		owner uint32
		ok    bool
	}{
		{"owner", &unix.Ucred{Uid: 1000}, 1000, true},
		{"other user", &unix.Ucred{Uid: 1001}, 1000, false},
		{"root", &unix.Ucred{Uid: 0}, 1000, true},
		{"unknown", nil, 1000, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := CanControl(tc.peer, tc.owner); got != tc.ok {
				t.Fatalf("CanControl = %v", got)
			}
		})
	}
}

// TestStatusShowsOwnSessions: STATUS lists a session only to its owner and root.
func TestStatusShowsOwnSessions(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, outFile(t), control.Open{Codec: "none", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Finish()
	me := uint32(os.Getuid())
	if n := len(ts.srv.StatusFor(&unix.Ucred{Uid: me}).Sessions); n != 1 {
		t.Fatalf("owner sees %d sessions", n)
	}
	if n := len(ts.srv.StatusFor(&unix.Ucred{Uid: 0}).Sessions); n != 1 {
		t.Fatalf("root sees %d sessions", n)
	}
	other := ts.srv.StatusFor(&unix.Ucred{Uid: me + 4242})
	if len(other.Sessions) != 0 || other.Daemon.Sessions != 1 {
		t.Fatalf("another user sees %+v", other)
	}
}

const (
	envHelper      = "STRAPD_TEST_HELPER"
	envSock        = "STRAPD_TEST_SOCK"
	envDeniedSock  = "STRAPD_TEST_DENIED_SOCK"
	envVictim      = "STRAPD_TEST_VICTIM"
	envOwnDir      = "STRAPD_TEST_OWN_DIR"
	helperResultLn = "HELPER-RESULT "
)

// helperResult is what the unprivileged helper reports about one attempt.
type helperResult struct {
	Attempt  string `json:"attempt"`
	Code     string `json:"code,omitempty"`
	Err      string `json:"err,omitempty"`
	Sessions int    `json:"sessions,omitempty"`
	Visible  int    `json:"visible,omitempty"`
}

// TestHelperUnprivilegedClient is the client side of TestRootDaemonUnprivilegedClient,
// run in a child process as an unprivileged uid. It reports each attempt on stdout.
func TestHelperUnprivilegedClient(t *testing.T) {
	if os.Getenv(envHelper) == "" {
		t.Skip("helper process of TestRootDaemonUnprivilegedClient")
	}
	report := func(r helperResult) {
		b, _ := json.Marshal(r)
		os.Stdout.WriteString(helperResultLn + string(b) + "\n")
	}
	codeOf := func(attempt string, err error) helperResult {
		r := helperResult{Attempt: attempt}
		var e *control.Error
		if errors.As(err, &e) {
			r.Code = e.Code
		}
		if err != nil {
			r.Err = err.Error()
		}
		return r
	}
	sock, victim, ownDir := os.Getenv(envSock), os.Getenv(envVictim), os.Getenv(envOwnDir)
	dial := func(path string) (*control.Client, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return control.Dial(ctx, path, "nobody")
	}
	c, err := dial(sock)
	if err != nil {
		report(codeOf("connect", err))
		return
	}
	c.Disconnect()

	_, err = os.OpenFile(victim, os.O_WRONLY, 0)
	report(codeOf("open victim for writing", err))

	size := uint64(shm.HeaderSize + 64<<10)
	label := map[string]any{"output_path": filepath.Join(filepath.Dir(victim), "label.strap")}
	try := func(attempt string, out *os.File) {
		defer out.Close()
		p, err := shm.NewProducer(size, shm.ProducerOptions{})
		if err != nil {
			report(codeOf(attempt, err))
			return
		}
		defer p.Close()
		c, err := dial(sock)
		if err != nil {
			report(codeOf(attempt, err))
			return
		}
		defer c.Disconnect()
		_, err = c.Open(p.File(), out, control.Open{RingSize: size, Codec: "none", Policy: "block", Metadata: label})
		report(codeOf(attempt, err))
	}
	if f, err := os.Open(victim); err == nil {
		try("victim read-only", f)
	}
	if fd, err := unix.Open(victim, unix.O_PATH|unix.O_CLOEXEC, 0); err == nil {
		try("victim O_PATH", os.NewFile(uintptr(fd), "opath"))
	}
	if f, err := os.Open(filepath.Dir(victim)); err == nil {
		try("victim's directory", f)
	}
	if fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
		defer unix.Close(fds[1])
		try("socket", os.NewFile(uintptr(fds[0]), "socket"))
	}

	if c, err := dial(sock); err == nil {
		rep, err := c.Status()
		r := codeOf("status", err)
		r.Sessions, r.Visible = rep.Daemon.Sessions, len(rep.Sessions)
		report(r)
		c.Disconnect()
	}

	_, err = dial(os.Getenv(envDeniedSock))
	report(codeOf("allow-list", err))

	// Its own file, labelled with the victim's directory: written, and only it.
	out, err := os.OpenFile(filepath.Join(ownDir, "own.strap"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		report(codeOf("own capture", err))
		return
	}
	defer out.Close()
	c, err = dial(sock)
	if err != nil {
		report(codeOf("own capture", err))
		return
	}
	defer c.Disconnect()
	st, _, err := controltest.OpenStream(c, size, out, control.Open{Codec: "lz4", Policy: "block", Metadata: label})
	if err == nil {
		for i := range 3 {
			tn := tensor("m", uint64(i+1), 1000)
			if err = st.Put(&tn); err != nil {
				break
			}
		}
	}
	if err == nil {
		_, err = st.Finish()
	}
	report(codeOf("own capture", err))
}

// startServerAt is startServer with a chosen socket path.
func startServerAt(t *testing.T, sock string, cfg Config) *testServer {
	t.Helper()
	cfg.Socket = sock
	cfg.Workers = 1
	srv := New(cfg, nil)
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, sock: sock, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

// copyExecutable copies the running test binary to dst with mode 0755, so another uid can
// run it (go test builds it in a directory only its owner can enter).
func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStatusForHidesOtherUsersWatchedPIDs(t *testing.T) {
	full := control.StatusReply{
		Daemon: control.DaemonStatus{PID: 10, Probes: &control.ProbesStatus{}},
		Sessions: []control.SessionStatus{
			{Session: 1, PID: 100, UID: 1000},
			{Session: 2, PID: 200, UID: 2000},
		},
	}
	full.Daemon.Probes.Watched = []int{10, 100, 200, 300}
	tests := []struct {
		name     string
		peer     *unix.Ucred
		sessions int
		watched  []int
	}{
		{"root sees all", &unix.Ucred{Uid: 0}, 2, []int{10, 100, 200, 300}},
		{"owner sees own", &unix.Ucred{Uid: 1000}, 1, []int{10, 100}},
		{"stranger sees daemon only", &unix.Ucred{Uid: 3000}, 0, []int{10}},
		{"no credentials", nil, 0, []int{10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := full
			in.Sessions = append([]control.SessionStatus(nil), full.Sessions...)
			got := statusFor(in, tt.peer)
			if len(got.Sessions) != tt.sessions {
				t.Fatalf("sessions = %d, want %d", len(got.Sessions), tt.sessions)
			}
			if !slices.Equal(got.Daemon.Probes.Watched, tt.watched) {
				t.Fatalf("watched = %v, want %v", got.Daemon.Probes.Watched, tt.watched)
			}
			if !slices.Equal(full.Daemon.Probes.Watched, []int{10, 100, 200, 300}) {
				t.Fatal("filtering changed the daemon's own status")
			}
		})
	}
}
