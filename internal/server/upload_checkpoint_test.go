package server

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const validCheckpoint = `{"format":"strap-checkpoint","version":1,"stream":"/x/s.strap","fingerprint":"sha256:ab",
"stream_offset":900,"packets":3,"drops":0,"last_seq":3,"last_packet_offset":700,"last_packet_crc":12,"token_count":2,"forward_count":2}`

// openCheckpoint hands strapd a session's checkpoint only as the session's owner could read
// it: strapd may run as root, and the file goes into the client's bucket.
func TestOpenCheckpointForUpload(t *testing.T) {
	dir := t.TempDir()
	uid := uint32(os.Geteuid())
	good := filepath.Join(dir, "s.strap.ckpt.json")
	if err := os.WriteFile(good, []byte(validCheckpoint), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := openCheckpoint(good, uid)
	if err != nil {
		t.Fatal(err)
	}
	// Handed back at its start: the upload reads it whole.
	if b, _ := io.ReadAll(f); string(b) != validCheckpoint {
		t.Fatalf("read %q", b)
	}
	f.Close()

	if _, err := openCheckpoint(filepath.Join(dir, "none.ckpt.json"), uid); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("absent: %v", err)
	}
	link := filepath.Join(dir, "link.ckpt.json")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if _, err := openCheckpoint(link, uid); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a symlink was followed: %v", err)
	}
	bad := filepath.Join(dir, "bad.ckpt.json")
	if err := os.WriteFile(bad, []byte(`{"format":"strap-checkpoint"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openCheckpoint(bad, uid); err == nil || !strings.Contains(err.Error(), "missing field") {
		t.Fatalf("invalid checkpoint: %v", err)
	}
	fifo := filepath.Join(dir, "fifo.ckpt.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := openCheckpoint(fifo, uid); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("fifo: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO blocked")
	}
	// Another user's file: refused whoever strapd runs as (root can chown it here).
	if os.Geteuid() == 0 {
		other := filepath.Join(dir, "other.ckpt.json")
		if err := os.WriteFile(other, []byte(validCheckpoint), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		if _, err := openCheckpoint(other, 4242); err == nil || !strings.Contains(err.Error(), "belongs to uid 12345") {
			t.Fatalf("another user's file: %v", err)
		}
		if f, err := openCheckpoint(other, 12345); err != nil {
			t.Fatalf("the session owner's file: %v", err)
		} else {
			f.Close()
		}
	} else {
		t.Log("not root: the other-owner case needs chown (CI runs it as root)")
	}
}
