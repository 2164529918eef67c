//go:build privileged

package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/upload"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

// A root daemon's credentials are not another user's to aim: a client of uid 65534 may
// upload only under the daemon's targets, its stream (0644, the client's own) is read back
// through strapd's descriptor, and STATUS shows it only its own uploads.
func TestRootDaemonUploadsForOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the daemon runs as root and the client as uid 65534")
	}
	srv := uploadtest.Start(t)
	client := srv.Client(t)
	srv.Bucket(t, client, "caps")
	m, err := upload.NewManager(upload.Options{Client: client, StateDir: t.TempDir(), PartSize: upload.MinPartSize,
		MinBackoff: 50 * time.Millisecond, KeepLocal: true, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	base, err := os.MkdirTemp("", "strapd-upload-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
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
	fleet := upload.Target{Bucket: "caps", Prefix: "fleet"}
	ts := startServerAt(t, filepath.Join(base, "run", "s.sock"), Config{Access: Access{SocketMode: 0o660, SocketGID: 65534},
		Uploads: Uploads{Manager: m, Default: &fleet, Allowed: []upload.Target{fleet}}})

	// Root's own upload, which nobody must not see in STATUS.
	if _, _, _, err := capture(t, ts, control.Open{Codec: "none", Policy: "block", Upload: "s3://caps/root-only"}, 1<<20, 4, 1024); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if !m.Wait(ctx) {
		t.Fatalf("root's upload not done: %+v", m.Status())
	}

	cmd := exec.Command(helper, "-test.run=^TestHelperUploadClient$", "-test.count=1")
	cmd.Env = []string{envHelper + "=1", envSock + "=" + ts.sock, envOwnDir + "=" + ownDir, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	res := map[string]helperResult{}
	for sc := bufio.NewScanner(&stdout); sc.Scan(); {
		if line, ok := strings.CutPrefix(sc.Text(), helperResultLn); ok {
			var r helperResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatal(err)
			}
			res[r.Attempt] = r
		}
	}
	t.Logf("helper: %+v", res)
	if r := res["upload elsewhere"]; r.Code != control.CodeUploadRefused || !strings.Contains(r.Err, "--upload-allow") {
		t.Errorf("upload elsewhere: %+v, want upload_refused", r)
	}
	for _, a := range []string{"upload under the daemon's target", "upload to the daemon's target"} {
		if r := res[a]; r.Err != "" {
			t.Errorf("%s: %+v", a, r)
		}
	}
	if !m.Wait(ctx) {
		t.Fatalf("nobody's uploads not done: %+v", m.Status())
	}
	for key, file := range map[string]string{"fleet/nobody/own1.strap": "own1.strap", "fleet/nobody/own2.strap": "own2.strap"} {
		local, err := os.ReadFile(filepath.Join(ownDir, file))
		if err != nil {
			t.Fatal(err)
		}
		if got := uploadtest.Object(t, client, "caps", key); !bytes.Equal(got, local) {
			t.Errorf("%s differs from %s", key, file)
		}
	}
	if r := res["status"]; r.Visible != 0 || r.Sessions != 2 { // Sessions counts its own uploads here
		t.Errorf("status as nobody listed %d uploads of others (and %d of its own, want 2): root's must not show", r.Visible, r.Sessions)
	}
}
