package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

// leaveOpenUpload leaves body as the parts of an open multipart upload of key in bucket
// caps (5 MiB parts, the last shorter), the way a dead strapd leaves it.
func leaveOpenUpload(t *testing.T, c *upload.Client, key string, body []byte) {
	t.Helper()
	n := int32((len(body) + upload.MinPartSize - 1) / upload.MinPartSize)
	parts := make([]int32, n)
	for i := range parts {
		parts[i] = int32(i + 1)
	}
	uploadtest.OpenUpload(t, c, "caps", key, body, upload.MinPartSize, parts...)
}

// wholeStream is a complete stream of a dozen 1 MiB tensors and a token after each.
func wholeStream(t *testing.T) []byte {
	path := filepath.Join(t.TempDir(), "whole.strap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := stream.New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 12 {
		raw := bytes.Repeat([]byte{byte(k), 7, byte(3 * k)}, 1<<20/3+1)[:1<<20]
		for _, p := range []stream.Packet{
			{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{1 << 20}, Seq: uint64(2*k + 1), Step: uint64(k), RawLen: 1 << 20}, Name: "m", Blocks: []stream.Block{{Data: raw}}},
			{Header: stream.Header{Type: stream.TypeToken, Seq: uint64(2*k + 2), Step: uint64(k)}, Name: "token", Meta: []byte(`{"token_id":1}`)},
		} {
			if err := w.WritePacket(&p); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(stream.EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSalvageCommand: the report of the strapd binary for an upload left with every part of
// a stream that had ended (the whole stream: verify passes, nothing to resume), and for one
// whose bytes are no stream at all (completed, but exit 2 saying so).
func TestSalvageCommand(t *testing.T) {
	bin := strapdBinary(t)
	srv := uploadtest.Start(t)
	c := srv.Client(t)
	srv.Bucket(t, c, "caps")
	env := srv.Env()

	whole := wholeStream(t)
	if len(whole) < 2*upload.MinPartSize {
		t.Fatalf("stream of %d bytes: want 3 parts", len(whole))
	}
	leaveOpenUpload(t, c, "run/whole.strap", whole)
	code, out, stderr := runStrapd(t, bin, env, "salvage", "--s3-endpoint", srv.Endpoint, "--list", "--json", "s3://caps/run")
	var ups []upload.OpenUpload
	if code != 0 || json.Unmarshal([]byte(out), &ups) != nil || len(ups) != 1 || ups[0].RunParts != 3 || ups[0].RunBytes != int64(len(whole)) {
		t.Fatalf("list: exit %d: %s %s", code, out, stderr)
	}
	code, out, stderr = runStrapd(t, bin, env, "salvage", "--s3-endpoint", srv.Endpoint, "--host-is-gone", "s3://caps/run/whole.strap")
	if code != 0 || !strings.Contains(out, "from parts 1..3") || !strings.Contains(out, "whole: the stream ended complete") ||
		strings.Contains(out, "not readable") || strings.Contains(out, "no INDEX") {
		t.Fatalf("whole stream: exit %d: %s %s", code, out, stderr)
	}
	t.Logf("salvage of the whole stream:\n%s", out)
	if got := uploadtest.Object(t, c, "caps", "run/whole.strap"); !bytes.Equal(got, whole) {
		t.Fatal("the object is not the stream")
	}
	if code, out, stderr = runStrapd(t, bin, env, "verify", "--s3-endpoint", srv.Endpoint, "s3://caps/run/whole.strap"); code != 0 {
		t.Fatalf("verify: exit %d: %s %s", code, out, stderr)
	}

	junk := bytes.Repeat([]byte("not a stream "), upload.MinPartSize/13+100)
	leaveOpenUpload(t, c, "run/junk.strap", junk)
	code, out, stderr = runStrapd(t, bin, env, "salvage", "--s3-endpoint", srv.Endpoint, "--host-is-gone", "s3://caps/run/junk.strap")
	if code != 2 || !strings.Contains(stderr, "completed, but not readable as a capture stream") || !strings.Contains(out, "damaged at offset 0") {
		t.Fatalf("junk: exit %d: %s %s", code, out, stderr)
	}

	// Bad arguments: a bucket without a key, not an s3:// URL.
	if code, _, stderr = runStrapd(t, bin, env, "salvage", "--s3-endpoint", srv.Endpoint, "--host-is-gone", "s3://caps"); code != 1 || !strings.Contains(stderr, "names a bucket, not an object") {
		t.Fatalf("bucket only: exit %d: %s", code, stderr)
	}
	if code, _, stderr = runStrapd(t, bin, env, "salvage", "/tmp/x.strap"); code != 1 || !strings.Contains(stderr, "not an s3:// URL") {
		t.Fatalf("a path: exit %d: %s", code, stderr)
	}
}
