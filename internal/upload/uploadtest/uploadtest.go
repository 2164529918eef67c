// Package uploadtest runs a real S3 server (VersityGW, posix backend on a temporary
// directory) for tests of uploads and range reads.
package uploadtest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/strap-llm/strap/internal/upload"
)

// Access and Secret are the test server's root credentials.
const (
	Access = "strapaccess"
	Secret = "strapsecret1234"
)

// Server is a running VersityGW.
type Server struct {
	t        testing.TB
	bin      string
	Dir      string
	Addr     string
	Endpoint string
	cmd      *exec.Cmd
	logPath  string
}

// Binary finds VersityGW: $STRAP_VERSITYGW, else the Makefile's cache path, built there
// with `make versitygw` when missing. It skips the test, saying why, only when it cannot
// be built.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("STRAP_VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	home, _ := os.UserHomeDir()
	p := filepath.Join(home, ".cache", "strap-llm", "versitygw-1.8.0", "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	root, err := repoRoot()
	if err != nil {
		t.Skipf("VersityGW is not built and the checkout's Makefile cannot be found to build it: %v", err)
	}
	t.Logf("building VersityGW with make versitygw (once; cached in %s)", filepath.Dir(p))
	out, err := exec.Command("make", "-C", root, "--no-print-directory", "versitygw", "VERSITYGW="+p).CombinedOutput()
	if err != nil {
		t.Skipf("VersityGW could not be built (make versitygw: %v): %s", err, out)
	}
	return p
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the module")
	}
	return filepath.Dir(mod), nil
}

// Start runs VersityGW on a free local port with a fresh posix backend directory.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), Dir: t.TempDir()}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = l.Addr().String()
	l.Close()
	s.Endpoint = "http://" + s.Addr
	s.logPath = filepath.Join(t.TempDir(), "versitygw.log")
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// Restart starts the server again on the same port and directory (after Kill).
func (s *Server) Restart() {
	s.t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	s.cmd = exec.Command(s.bin, "--access", Access, "--secret", Secret, "--port", s.Addr, "--quiet", "posix", s.Dir)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(s.logPath)
	s.t.Fatalf("versitygw did not listen on %s: %s", s.Addr, b)
}

// Freeze stops the server (SIGSTOP) without closing its socket: connections are accepted
// by the kernel and never answered, as a network black hole or a hung server does.
func (s *Server) Freeze() {
	if s.cmd != nil && s.cmd.Process != nil {
		if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			s.t.Fatal(err)
		}
	}
}

// Thaw lets a frozen server go on (SIGCONT).
func (s *Server) Thaw() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Kill stops the server with SIGKILL (a crash, not a shutdown).
func (s *Server) Kill() {
	s.Thaw() // a stopped process dies too, but its wait would not be reaped otherwise
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Env is the environment a process needs to reach the server with the standard AWS variables.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + Access, "AWS_SECRET_ACCESS_KEY=" + Secret, "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=" + os.DevNull, "AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull}
}

// Client is an S3 client for the server with its root credentials (set in the environment
// of this process, as strapd would find them).
func (s *Server) Client(t testing.TB) *upload.Client {
	t.Helper()
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	c, err := upload.NewClient(context.Background(), upload.ClientOptions{Endpoint: s.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Bucket creates a bucket.
func (s *Server) Bucket(t testing.TB, c *upload.Client, name string) {
	t.Helper()
	if _, err := c.S3().CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
}

// Object reads a whole object.
func Object(t testing.TB, c *upload.Client, bucket, key string) []byte {
	t.Helper()
	out, err := c.S3().GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get s3://%s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// OpenUpload starts a multipart upload of bucket/key the way strapd does (CRC32C parts)
// and sends the given parts of data, part n being bytes [(n-1)*partSize, n*partSize) (the
// last one shorter where data ends) — what a strapd that died mid-capture leaves. It
// returns the upload id.
func OpenUpload(t testing.TB, c *upload.Client, bucket, key string, data []byte, partSize int, parts ...int32) string {
	t.Helper()
	ctx := context.Background()
	out, err := c.S3().CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range parts {
		b := data[int(n-1)*partSize : min(int(n)*partSize, len(data))]
		var crc [4]byte
		binary.BigEndian.PutUint32(crc[:], crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
		if _, err := c.S3().UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key),
			UploadId: out.UploadId, PartNumber: aws.Int32(n), Body: bytes.NewReader(b), ContentLength: aws.Int64(int64(len(b))),
			ChecksumCRC32C: aws.String(base64.StdEncoding.EncodeToString(crc[:]))}); err != nil {
			t.Fatal(err)
		}
	}
	return aws.ToString(out.UploadId)
}
