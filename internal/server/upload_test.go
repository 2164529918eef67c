package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

func TestUploadRefusals(t *testing.T) {
	ts := startServer(t, Config{})
	for _, tc := range []struct {
		name, url, code string
	}{
		{"not an s3 url", "caps/run", control.CodeBadMessage},
		{"bad bucket", "s3://Caps/run", control.CodeBadMessage},
		{"no object storage configured", "s3://caps/run", control.CodeUploadRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := capture(t, ts, control.Open{Codec: "none", Policy: "block", Upload: tc.url}, 1<<20, 1, 16)
			ce, ok := errors.AsType[*control.Error](err)
			if !ok || ce.Code != tc.code {
				t.Fatalf("err = %v, want code %s", err, tc.code)
			}
		})
	}
}

// A session's stream goes to the daemon's target (and a session's own) through the real
// server, read back from the output descriptor the client opened write-only.
func TestUploadThroughServer(t *testing.T) {
	srv := uploadtest.Start(t)
	client := srv.Client(t)
	srv.Bucket(t, client, "caps")
	m, err := upload.NewManager(upload.Options{Client: client, StateDir: t.TempDir(), PartSize: upload.MinPartSize,
		Concurrency: 2, MinBackoff: 50 * time.Millisecond, KeepLocal: true, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	def := upload.Target{Bucket: "caps", Prefix: "fleet"}
	ts := startServer(t, Config{Uploads: Uploads{Manager: m, Default: &def, Allowed: []upload.Target{def}}})
	for _, tc := range []struct{ name, url, prefix string }{
		{"daemon target", "", "fleet/" + userSegment(uint32(os.Getuid()))}, // a component per user
		{"session target", "s3://caps/own/run", "own/run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 64 tensors of 32 K floats: 8 MiB, more than one 5 MiB part.
			out, _, cl, err := capture(t, ts, control.Open{Codec: "none", Policy: "block", Upload: tc.url}, 4<<20, 64, 32<<10)
			if err != nil {
				t.Fatal(err)
			}
			want := upload.ObjectURL("caps", tc.prefix+"/out.strap")
			if cl.Upload != want {
				t.Fatalf("CLOSED upload = %q, want %q", cl.Upload, want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if !m.Wait(ctx) {
				t.Fatalf("upload not done: %+v", m.Status())
			}
			local, err := os.ReadFile(out.Name())
			if err != nil {
				t.Fatal(err)
			}
			if got := uploadtest.Object(t, client, "caps", tc.prefix+"/out.strap"); !bytes.Equal(got, local) {
				t.Fatalf("object (%d bytes) differs from the stream (%d bytes)", len(got), len(local))
			}
			rep := ts.srv.Status()
			var found *control.UploadStatus
			for i := range rep.Uploads {
				if rep.Uploads[i].Object == want {
					found = &rep.Uploads[i]
				}
			}
			if found == nil || found.State != upload.StateComplete || found.Parts < 2 || found.UploadedBytes != int64(len(local)) {
				t.Fatalf("status upload %+v", found)
			}
			if rep.Daemon.Upload == nil || rep.Daemon.Upload.Target != "s3://caps/fleet" || rep.Daemon.Upload.UploadedBytes == 0 {
				t.Fatalf("daemon upload status %+v", rep.Daemon.Upload)
			}
			// inspect by range (as `strapd inspect s3://...`): the same summary as the
			// local file's, from the packets' headers, not their 128 KiB payloads.
			r, err := upload.OpenObject(context.Background(), client, want, 16<<10)
			if err != nil {
				t.Fatal(err)
			}
			remote, err := stream.Inspect(r, r.Size())
			if err != nil {
				t.Fatal(err)
			}
			local2, err := stream.InspectFile(out.Name())
			if err != nil {
				t.Fatal(err)
			}
			if remote.Packets != local2.Packets || remote.StoredBytes != local2.StoredBytes || len(remote.Modules) != len(local2.Modules) {
				t.Fatalf("inspect by range %+v, local %+v", remote, local2)
			}
			fetched, gets := r.Fetched()
			t.Logf("inspect by range fetched %d of %d bytes in %d GETs", fetched, r.Size(), gets)
			if fetched > r.Size()/4 {
				t.Fatalf("inspect fetched %d of %d bytes in %d GETs", fetched, r.Size(), gets)
			}
		})
	}
}

// TestHelperUploadClient is the uid-65534 side of TestRootDaemonUploadsForOtherUser
// (upload_privileged_test.go): it reports each attempt as a helperResult line.
func TestHelperUploadClient(t *testing.T) {
	if os.Getenv(envHelper) == "" {
		t.Skip("helper process of TestRootDaemonUploadsForOtherUser")
	}
	report := func(attempt string, err error) {
		r := helperResult{Attempt: attempt}
		if ce, ok := errors.AsType[*control.Error](err); ok {
			r.Code = ce.Code
		}
		if err != nil {
			r.Err = err.Error()
		}
		b, _ := json.Marshal(r)
		os.Stdout.WriteString(helperResultLn + string(b) + "\n")
	}
	sock, ownDir := os.Getenv(envSock), os.Getenv(envOwnDir)
	dial := func() (*control.Client, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return control.Dial(ctx, sock, "nobody")
	}
	try := func(attempt, file, url string) {
		out, err := os.OpenFile(filepath.Join(ownDir, file), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			report(attempt, err)
			return
		}
		defer out.Close()
		c, err := dial()
		if err != nil {
			report(attempt, err)
			return
		}
		defer c.Disconnect()
		st, _, err := controltest.OpenStream(c, 1<<20, out, control.Open{Codec: "none", Policy: "block", Upload: url})
		if err == nil {
			for i := range 3 {
				tn := tensor("model.layers.0.mlp", uint64(i+1), 1024)
				if err = st.Put(&tn); err != nil {
					break
				}
			}
			if err == nil {
				_, err = st.Finish()
			}
		}
		report(attempt, err)
	}
	try("upload elsewhere", "own0.strap", "s3://caps/elsewhere")
	try("upload under the daemon's target", "own1.strap", "s3://caps/fleet/nobody")
	try("upload to the daemon's target", "own2.strap", "")
	c, err := dial()
	if err != nil {
		report("status", err)
		return
	}
	defer c.Disconnect()
	rep, err := c.Status()
	r := helperResult{Attempt: "status"}
	if err != nil {
		r.Err = err.Error()
	}
	for _, u := range rep.Uploads {
		if u.UID == 65534 {
			r.Sessions++
		} else {
			r.Visible++
		}
	}
	b, _ := json.Marshal(r)
	os.Stdout.WriteString(helperResultLn + string(b) + "\n")
}

// The daemon's target gets a component per user: the name from the password database, or
// uid-N for a uid without one (or with a name that is no plain key segment).
func TestUserSegment(t *testing.T) {
	for _, tc := range []struct {
		uid  uint32
		want string
	}{
		{0, "root"},
		{3999999, "uid-3999999"},
	} {
		if got := userSegment(tc.uid); got != tc.want {
			t.Errorf("userSegment(%d) = %q, want %q", tc.uid, got, tc.want)
		}
	}
	for _, name := range []string{"", ".", "..", "uid-7", "a/b", "é", strings.Repeat("a", 65)} {
		if plainSegment(name) {
			t.Errorf("plainSegment(%q) = true", name)
		}
	}
}
