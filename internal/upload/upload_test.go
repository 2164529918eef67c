package upload_test

import (
	"bytes"
	"context"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap/zaptest"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

type fixture struct {
	srv    *uploadtest.Server
	client *upload.Client
	state  string
	dir    string
}

func newFixture(t *testing.T) *fixture {
	srv := uploadtest.Start(t)
	c := srv.Client(t)
	srv.Bucket(t, c, "caps")
	return &fixture{srv: srv, client: c, state: t.TempDir(), dir: t.TempDir()}
}

func (f *fixture) manager(t *testing.T, keep bool) *upload.Manager {
	m, err := upload.NewManager(upload.Options{Client: f.client, StateDir: f.state, PartSize: upload.MinPartSize,
		Concurrency: 2, KeepLocal: keep, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// begin opens a stream file for writing and the upload of it; write appends and marks durable.
func (f *fixture) begin(t *testing.T, m *upload.Manager, name string, appendAt int64) (*os.File, *upload.Upload) {
	path := filepath.Join(f.dir, name)
	w, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	u, err := m.Begin(upload.Stream{File: r, Path: path, Target: upload.Target{Bucket: "caps", Prefix: "run/a"}, AppendAt: appendAt})
	if err != nil {
		t.Fatal(err)
	}
	return w, u
}

func wait(t *testing.T, u *upload.Upload, d time.Duration) upload.Status {
	t.Helper()
	select {
	case <-u.Done():
	case <-time.After(d):
		t.Fatalf("upload not done after %v: %+v", d, u.Status())
	}
	return u.Status()
}

func TestUploadWhileWriting(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
		keep bool
	}{
		{"small single part", 300 << 10, true},
		{"exact part multiple", 2 * upload.MinPartSize, true},
		{"several parts", 3*upload.MinPartSize + 12345, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			m := f.manager(t, tc.keep)
			w, u := f.begin(t, m, "s.strap", 0)
			data := randomBytes(tc.size, uint64(tc.size))
			// Written in uneven pieces, each made durable: parts go while the file grows.
			for off := 0; off < len(data); {
				n := min(len(data)-off, 1<<20+777)
				if _, err := w.Write(data[off : off+n]); err != nil {
					t.Fatal(err)
				}
				off += n
				u.Durable(int64(off))
			}
			if err := u.Finish(nil); err != nil {
				t.Fatal(err)
			}
			st := wait(t, u, 60*time.Second)
			if st.State != upload.StateComplete || st.UploadedBytes != int64(len(data)) || st.LagBytes != 0 {
				t.Fatalf("status %+v", st)
			}
			if got := uploadtest.Object(t, f.client, "caps", "run/a/s.strap"); !bytes.Equal(got, data) {
				t.Fatalf("object differs from the file (%d vs %d bytes)", len(got), len(data))
			}
			_, err := os.Stat(filepath.Join(f.dir, "s.strap"))
			if tc.keep != (err == nil) {
				t.Fatalf("keep=%v but stat: %v", tc.keep, err)
			}
			if names, _ := filepath.Glob(filepath.Join(f.state, "*")); len(names) != 0 {
				t.Fatalf("state files left: %v", names)
			}
		})
	}
}

// Only durable bytes go: nothing is uploaded past the last Durable offset before Finish.
func TestUploadWaitsForDurableBytes(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "d.strap", 0)
	data := randomBytes(3*upload.MinPartSize, 7)
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	u.Durable(upload.MinPartSize + 10)
	deadline := time.Now().Add(20 * time.Second)
	for u.Status().UploadedBytes < upload.MinPartSize && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if st := u.Status(); st.UploadedBytes != upload.MinPartSize || st.LagBytes != 10 {
		t.Fatalf("after Durable(part+10): %+v", st)
	}
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	wait(t, u, 60*time.Second)
	if got := uploadtest.Object(t, f.client, "caps", "run/a/d.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs")
	}
}

// The server is killed mid-upload and restarted: the upload retries and the object is exact.
func TestUploadSurvivesServerRestart(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "r.strap", 0)
	data := randomBytes(4*upload.MinPartSize+99, 9)
	half := 2 * upload.MinPartSize
	w.Write(data[:half])
	u.Durable(int64(half))
	waitUploaded(t, u, upload.MinPartSize)
	f.srv.Kill()
	w.Write(data[half:])
	u.Durable(int64(len(data)))
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for u.Status().Errors == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := u.Status(); st.Errors == 0 || st.LastError == "" || st.State == upload.StateComplete {
		t.Fatalf("no error seen with the server down: %+v", st)
	}
	f.srv.Restart()
	st := wait(t, u, 60*time.Second)
	if st.State != upload.StateComplete {
		t.Fatalf("%+v", st)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/r.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs after a server restart")
	}
}

// strapd stops mid-upload (Manager.Close, as on SIGKILL nothing more is written than the
// state file says); a new manager on the same state directory completes the upload.
func TestUploadResumesAfterRestart(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "k.strap", 0)
	data := randomBytes(3*upload.MinPartSize+5, 11)
	w.Write(data)
	u.Durable(2 * upload.MinPartSize)
	waitUploaded(t, u, 2*upload.MinPartSize)
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if _, err := os.Stat(filepath.Join(f.state)); err != nil {
		t.Fatal(err)
	}
	m2 := f.manager(t, true)
	if err := m2.ResumePending(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if !m2.Wait(ctx) {
		t.Fatalf("restarted upload not done: %+v", m2.Status())
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/k.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs after a restart")
	}
}

// A resumed capture cuts the file back to its checkpoint and writes on: parts wholly inside
// the prefix are kept, the rest go again with the new bytes.
func TestUploadResumedCapture(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "c.strap", 0)
	first := randomBytes(3*upload.MinPartSize, 13)
	w.Write(first)
	u.Durable(int64(len(first)))
	waitUploaded(t, u, int64(len(first)))
	m.Close() // the session died without Finish
	w.Close()
	cut := int64(upload.MinPartSize + 1000) // the checkpoint
	path := filepath.Join(f.dir, "c.strap")
	if err := os.Truncate(path, cut); err != nil {
		t.Fatal(err)
	}
	m2 := f.manager(t, true)
	if err := m2.ResumePending(); err != nil {
		t.Fatal(err)
	}
	// Until the capture resumes, status shows the upload the restart found waiting.
	if sts := m2.Status(); len(sts) != 1 || sts[0].State != upload.StateWaiting || sts[0].Path != path ||
		sts[0].Parts != 3 || sts[0].UploadedBytes != int64(len(first)) || !strings.Contains(sts[0].LastError, "resume") {
		t.Fatalf("status after the restart: %+v", sts)
	}
	w2, u2 := f.begin(t, m2, "c.strap", cut)
	if sts := m2.Status(); len(sts) != 1 || sts[0].State == upload.StateWaiting {
		t.Fatalf("status once the capture resumed: %+v", sts)
	}
	tail := randomBytes(upload.MinPartSize+77, 14)
	w2.WriteAt(tail, cut)
	want := append(append([]byte(nil), first[:cut]...), tail...)
	u2.Durable(int64(len(want)))
	if err := u2.Finish(nil); err != nil {
		t.Fatal(err)
	}
	wait(t, u2, 60*time.Second)
	if got := uploadtest.Object(t, f.client, "caps", "run/a/c.strap"); !bytes.Equal(got, want) {
		t.Fatal("object differs after a resumed capture")
	}
}

func TestUploadBadCredentials(t *testing.T) {
	f := newFixture(t)
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
	c, err := upload.NewClient(context.Background(), upload.ClientOptions{Endpoint: f.srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	f.client = c
	m := f.manager(t, false)
	w, u := f.begin(t, m, "b.strap", 0)
	w.Write(randomBytes(1000, 1))
	u.Finish(nil)
	deadline := time.Now().Add(20 * time.Second)
	for u.Status().Errors == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	st := u.Status()
	if !strings.Contains(st.LastError, "credentials refused") || st.State != upload.StateRetrying {
		t.Fatalf("status %+v", st)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "b.strap")); err != nil {
		t.Fatalf("local file not kept: %v", err)
	}
}

func TestObjectReader(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "o.strap", 0)
	data := randomBytes(3<<20+5, 3)
	w.Write(data)
	u.Finish(nil)
	wait(t, u, 60*time.Second)
	r, err := upload.OpenObject(context.Background(), f.client, "s3://caps/run/a/o.strap", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r.Size() != int64(len(data)) {
		t.Fatalf("size %d", r.Size())
	}
	// The last 5 bytes are the last block: one GET of 5 bytes.
	buf := make([]byte, 5)
	if _, err := r.ReadAt(buf, int64(len(data))-5); err != nil || !bytes.Equal(buf, data[len(data)-5:]) {
		t.Fatalf("tail: %v", err)
	}
	if fetched, gets := r.Fetched(); gets != 1 || fetched != 5 {
		t.Fatalf("fetched %d bytes in %d GETs for the last 5 bytes", fetched, gets)
	}
	big := make([]byte, 2<<20)
	if _, err := r.ReadAt(big, 500000); err != nil || !bytes.Equal(big, data[500000:500000+len(big)]) {
		t.Fatalf("middle: %v", err)
	}
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	// A read the server does not answer is an error of the reader, kept for its caller
	// (strapd verify then fails to read rather than call the object damaged).
	f.srv.Kill()
	if _, err := r.ReadAt(buf, 10); err == nil || r.Err() == nil {
		t.Fatalf("read with the server down: %v, Err %v", err, r.Err())
	}
}

// A session on a file whose earlier upload is still going (its server down, say) takes it
// over: the old one stops, the new one keeps the parts inside AppendAt.
func TestBeginTakesOverActiveUpload(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "t.strap", 0)
	first := randomBytes(3*upload.MinPartSize, 21)
	w.Write(first)
	u.Durable(2 * upload.MinPartSize)
	waitUploaded(t, u, 2*upload.MinPartSize)
	f.srv.Kill()
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); u.Status().Errors == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no upload error after 60 s: %+v", u.Status())
		}
	}
	cut := int64(upload.MinPartSize + 3)
	path := filepath.Join(f.dir, "t.strap")
	if err := os.Truncate(path, cut); err != nil {
		t.Fatal(err)
	}
	_, u2 := f.begin(t, m, "t.strap", cut)
	select {
	case <-u.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the earlier upload did not stop")
	}
	tail := randomBytes(2*upload.MinPartSize, 22)
	w2, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	w2.WriteAt(tail, cut)
	want := append(append([]byte(nil), first[:cut]...), tail...)
	f.srv.Restart()
	u2.Durable(int64(len(want)))
	if err := u2.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, u2, 60*time.Second); st.State != upload.StateComplete {
		t.Fatalf("%+v", st)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/t.strap"); !bytes.Equal(got, want) {
		t.Fatal("object differs after a take-over")
	}
}

// prefixCRCs is a CRCSource over data: the CRC32C of [0, off) at multiples of grain and
// at the end, each xored with flip (a record that disagrees with the file when non-zero).
type prefixCRCs struct {
	data  []byte
	grain int64
	flip  uint32
	asked atomic.Int64
}

func (p *prefixCRCs) At(off int64) (uint32, bool) {
	p.asked.Add(1)
	if off > int64(len(p.data)) || (off%p.grain != 0 && off != int64(len(p.data))) {
		return 0, false
	}
	c := crc32.Checksum(p.data[:off], crc32.MakeTable(crc32.Castagnoli))
	if off > 0 {
		c ^= p.flip
	}
	return c, true
}

// TestUploadWriterCRCs: parts named by the writer's record of CRCs upload exact; a record
// that disagrees with the file (the server refuses the part) is dropped and the parts are
// read back, and the object is still exact.
func TestUploadWriterCRCs(t *testing.T) {
	for _, flip := range []uint32{0, 1} {
		f := newFixture(t)
		m := f.manager(t, true)
		w, u := f.begin(t, m, "s.strap", 0)
		data := randomBytes(3*upload.MinPartSize+4321, uint64(flip)+7)
		src := &prefixCRCs{data: data, grain: upload.MinPartSize, flip: flip}
		u.UseCRCs(src)
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
		u.Durable(int64(len(data)))
		if err := u.Finish(nil); err != nil {
			t.Fatal(err)
		}
		st := wait(t, u, 60*time.Second)
		if st.State != upload.StateComplete || st.UploadedBytes != int64(len(data)) {
			t.Fatalf("flip %d: status %+v", flip, st)
		}
		if got := uploadtest.Object(t, f.client, "caps", "run/a/s.strap"); !bytes.Equal(got, data) {
			t.Fatalf("flip %d: object differs from the file", flip)
		}
		if src.asked.Load() == 0 {
			t.Fatal("the record was never asked")
		}
		if flip == 0 && st.Errors != 0 {
			t.Fatalf("a right record, yet errors: %+v", st)
		}
	}
}

// TestUploadStreamWriterCRCs: a real stream written with the writer's CRC record (as a
// capture session does) uploads exact with no part read back for its checksum.
func TestUploadStreamWriterCRCs(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "s.strap", 0)
	sw, err := stream.NewWith(w, map[string]any{"k": "v"}, stream.WriterOptions{Direct: true, CRCGrain: upload.MinPartSize})
	if err != nil {
		t.Fatal(err)
	}
	u.UseCRCs(sw.RangeCRCs())
	for i := 0; sw.Offset() < 3*upload.MinPartSize+777; i++ {
		n := 1 + (i*7919)%(3<<20)
		p := stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(n)},
			RawLen: uint64(n), Seq: uint64(i + 1)}, Name: "t", Blocks: []stream.Block{{Data: randomBytes(n, uint64(i))}}}
		if err := sw.WritePacket(&p); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if err := sw.Sync(); err != nil {
				t.Fatal(err)
			}
			u.Durable(sw.Offset())
		}
	}
	if err := sw.Close(stream.EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	st := wait(t, u, 60*time.Second)
	if st.State != upload.StateComplete || st.Errors != 0 {
		t.Fatalf("status %+v", st)
	}
	file, err := os.ReadFile(filepath.Join(f.dir, "s.strap"))
	if err != nil {
		t.Fatal(err)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/s.strap"); !bytes.Equal(got, file) {
		t.Fatalf("object (%d bytes) differs from the file (%d bytes)", len(got), len(file))
	}
	if n := m.ReadBackParts(); n != 0 {
		t.Fatalf("%d parts read back for their CRC, none should be", n)
	}
}

// waitUploaded waits until the upload has n bytes acknowledged, failing the test after 60 s
// with the upload's status (an upload retries without end: the test must not).
func waitUploaded(t *testing.T, u *upload.Upload, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for u.Status().UploadedBytes < n {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s %d of %d bytes uploaded: %+v", u.Status().UploadedBytes, n, u.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// RemoveBeside deletes objects an earlier upload of the capture left beside it (an aborted
// session's checkpoint) once the new object is complete; one already gone is no error.
func TestUploadRemovesStaleObjectsBeside(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, key := range []string{"run/a/s.strap.ckpt.json", "run/a/other.json"} {
		if _, err := f.client.S3().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("caps"), Key: aws.String(key),
			Body: strings.NewReader("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	m := f.manager(t, true)
	w, u := f.begin(t, m, "s.strap", 0)
	data := randomBytes(300<<10, 5)
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	u.RemoveBeside("s.strap.ckpt.json", "never-there.json")
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, u, 60*time.Second); st.State != upload.StateComplete {
		t.Fatalf("status %+v", st)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/s.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs from the file")
	}
	if _, err := f.client.S3().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("caps"), Key: aws.String("run/a/s.strap.ckpt.json")}); err == nil {
		t.Fatal("the stale checkpoint object is still there")
	}
	// Only the named object went.
	if got := uploadtest.Object(t, f.client, "caps", "run/a/other.json"); string(got) != "{}" {
		t.Fatalf("other object: %q", got)
	}
}

// TestStatusIsTheWireType: the uploader's status is control.UploadStatus itself (issue 39),
// so STATUS_REPLY carries the uploader's values without a conversion that could drift.
func TestStatusIsTheWireType(t *testing.T) {
	if a, b := reflect.TypeFor[upload.Status](), reflect.TypeFor[control.UploadStatus](); a != b {
		t.Fatalf("upload.Status is %v, not %v", a, b)
	}
}
