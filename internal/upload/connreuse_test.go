package upload

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// TestSendfilePartsReuseTheConnection: parts sent one after another by sendfile go over one
// kept-alive connection when the server keeps it (a part's body and its answer are both read
// to the end). VersityGW answers every request with "Connection: close", so in the
// benchmarks every part pays a new connection (PERFORMANCE.md "Upload to object storage");
// S3 does not.
func TestSendfilePartsReuseTheConnection(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if n != r.ContentLength {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("ETag", `"e"`)
		w.Header().Set("X-Amz-Checksum-Crc32c", r.Header.Get("X-Amz-Checksum-Crc32c"))
		w.WriteHeader(http.StatusOK)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "k")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	c, err := NewClient(context.Background(), ClientOptions{Endpoint: srv.URL, Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 5 {
		etag, handled, err := c.uploadPartSendfile(context.Background(), "b", "k", "id", int32(i+1), f, int64(i)<<16, 3<<16, crcB64(uint32(i)))
		if err != nil || !handled || etag != `"e"` {
			t.Fatalf("part %d: etag %q handled %v err %v", i+1, etag, handled, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 parts in turn opened %d connections, want 1", n)
	}
}
