package upload_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
)

const mib = 1 << 20

func (f *fixture) freeManager(t *testing.T) *upload.Manager {
	m, err := upload.NewManager(upload.Options{Client: f.client, StateDir: f.state, PartSize: upload.MinPartSize,
		Concurrency: 2, KeepLocal: true, FreeLocal: true, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// freeCapture is a session's side of a capture with --upload-free-local: a real stream
// written to the file (and the same packets to a reference file that nothing frees), the
// upload told of durable bytes and checkpoints as the server does it.
type freeCapture struct {
	t       *testing.T
	path    string
	u       *upload.Upload
	sw, ref *stream.Writer
	refPath string
	seq     uint64
	indexed int
	ckpts   []upload.Checkpoint
	file    *os.File
	refFile *os.File
	// perSession asks for freeing in the session's Stream (the client's
	// upload_free_local) rather than from the manager's option.
	perSession bool
}

func startFree(t *testing.T, f *fixture, m *upload.Manager, name string) *freeCapture {
	return startFreeWith(t, f, m, name, false)
}

func startFreeWith(t *testing.T, f *fixture, m *upload.Manager, name string, perSession bool) *freeCapture {
	c := &freeCapture{t: t, path: filepath.Join(f.dir, name), refPath: filepath.Join(f.dir, name+".ref"), perSession: perSession}
	var err error
	if c.file, err = os.OpenFile(c.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.file.Close() })
	if c.refFile, err = os.Create(c.refPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.refFile.Close() })
	meta := map[string]any{"model_class": "T"}
	if c.sw, err = stream.New(c.file, meta); err != nil {
		t.Fatal(err)
	}
	if c.ref, err = stream.New(c.refFile, meta); err != nil {
		t.Fatal(err)
	}
	c.u = c.begin(t, m, 0, upload.Target{Bucket: "caps", Prefix: "run/a"})
	return c
}

// begin starts the upload of the capture's file as a session does (a read-only descriptor
// and a writable one to punch with).
func (c *freeCapture) begin(t *testing.T, m *upload.Manager, appendAt int64, target upload.Target) *upload.Upload {
	u, err := c.tryBegin(m, appendAt, target)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func (c *freeCapture) tryBegin(m *upload.Manager, appendAt int64, target upload.Target) (*upload.Upload, error) {
	r, err := os.Open(c.path)
	if err != nil {
		return nil, err
	}
	p, err := os.OpenFile(c.path, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	u, err := m.Begin(upload.Stream{File: r, Path: c.path, Target: target, AppendAt: appendAt, Punch: p, FreeLocal: c.perSession})
	if err != nil {
		r.Close()
		p.Close()
	}
	return u, err
}

// writeTo writes 256 KiB tensors until the stream holds off bytes, making them durable.
func (c *freeCapture) writeTo(off int64) {
	for c.sw.Offset() < off {
		c.seq++
		data := randomBytes(256<<10, c.seq)
		for _, w := range []*stream.Writer{c.sw, c.ref} {
			p := stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(len(data))},
				RawLen: uint64(len(data)), Seq: c.seq, Step: c.seq / 4, Forward: c.seq / 4}, Name: "layer", Blocks: []stream.Block{{Data: data}}}
			if err := w.WritePacket(&p); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	if err := c.sw.Sync(); err != nil {
		c.t.Fatal(err)
	}
	c.u.Durable(c.sw.Offset())
}

// checkpoint is a CHECKPOINT answered: synced, then the upload told.
func (c *freeCapture) checkpoint() upload.Checkpoint {
	if err := c.sw.Sync(); err != nil {
		c.t.Fatal(err)
	}
	lo, lc := c.sw.LastPacket()
	cp := upload.Checkpoint{Offset: c.sw.Offset(), Packets: c.sw.Packets(), Drops: c.sw.Drops(), Tokens: c.sw.Tokens(),
		LastSeq: c.sw.LastSeq(), LastOffset: lo, LastCRC: lc, Index: c.sw.IndexFrom(c.indexed)}
	c.indexed = c.sw.IndexLen()
	c.ckpts = append(c.ckpts, cp)
	c.u.Durable(cp.Offset)
	c.u.Checkpointed(cp)
	return cp
}

func waitFreed(t *testing.T, u *upload.Upload, n int64) upload.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for u.Status().FreedBytes < n {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s %d of %d bytes freed: %+v", u.Status().FreedBytes, n, u.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return u.Status()
}

func readState(t *testing.T, dir string) upload.State {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "upload-*.json"))
	if len(names) != 1 {
		t.Fatalf("state files: %v", names)
	}
	b, err := os.ReadFile(names[0])
	if err != nil {
		t.Fatal(err)
	}
	st, err := upload.ParseState(b)
	if err != nil {
		t.Fatal(err)
	}
	return *st
}

func readJournal(t *testing.T, dir string) *stream.Journal {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "upload-*.index"))
	if len(names) != 1 {
		t.Fatalf("journal files: %v", names)
	}
	b, err := os.ReadFile(names[0])
	if err != nil {
		t.Fatal(err)
	}
	j, err := stream.ParseJournal(b)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// freedUpTo brings a capture to the point where the upload has freed [4 KiB, 10 MiB): two
// parts below the last-but-one checkpoint (at 12 MiB).
func freedUpTo10MiB(t *testing.T, c *freeCapture) {
	c.writeTo(4 * mib)
	c.checkpoint()
	c.writeTo(12 * mib)
	c.checkpoint()
	waitUploaded(t, c.u, 10*mib)
	time.Sleep(300 * time.Millisecond)
	// Two checkpoints, but the last-but-one (4 MiB) ends no whole part: nothing is freed.
	if st := c.u.Status(); st.FreedBytes != 0 {
		t.Fatalf("freed before a part ended below the last-but-one checkpoint: %+v", st)
	}
	c.writeTo(17 * mib)
	c.checkpoint()
	waitFreed(t, c.u, 10*mib-4096)
}

// TestFreeLocalFreesBehindUploadAndCheckpoints: what is freed is whole acknowledged parts
// below the last-but-one checkpoint, from the first 4 KiB boundary after the header; the
// range is in the state file before it is punched and the index journal covers it; with
// the server down nothing past the acknowledged parts is freed; the object is exact.
func TestFreeLocalFreesBehindUploadAndCheckpoints(t *testing.T) {
	f := newFixture(t)
	m := f.freeManager(t)
	c := startFree(t, f, m, "f.strap")
	freedUpTo10MiB(t, c)
	if s, e, ok, err := stream.FreedRange(c.file, 0, c.sw.Offset()); err != nil || !ok || s != 4096 || e != 10*mib {
		t.Fatalf("holes in the file: [%d, %d) ok %v err %v; want [4096, 10 MiB)", s, e, ok, err)
	}
	st := readState(t, f.state)
	if st.FreedFrom != 4096 || st.FreedTo != 10*mib {
		t.Fatalf("state: freed [%d, %d)", st.FreedFrom, st.FreedTo)
	}
	j := readJournal(t, f.state)
	if j.End() < c.ckpts[1].Offset || j.End() < st.FreedTo {
		t.Fatalf("journal ends at %d, the freed range at %d, checkpoint 2 at %d", j.End(), st.FreedTo, c.ckpts[1].Offset)
	}
	all := c.sw.IndexFrom(0)
	for i, e := range j.Entries {
		if e.Offset != all[i].Offset || e.Seq != all[i].Seq || e.Name != all[i].Name {
			t.Fatalf("journal entry %d: %+v, the writer's %+v", i, e, all[i])
		}
	}

	// The server goes away: parts stop, checkpoints go on; nothing unacknowledged is freed.
	f.srv.Kill()
	up := c.u.Status().UploadedBytes
	c.writeTo(26 * mib)
	c.checkpoint()
	c.writeTo(30 * mib)
	c.checkpoint()
	time.Sleep(500 * time.Millisecond)
	if s := c.u.Status(); s.FreedBytes > up-4096 || s.UploadedBytes != up {
		t.Fatalf("with the server down: uploaded %d (was %d), freed %d", s.UploadedBytes, up, s.FreedBytes)
	}
	f.srv.Restart()
	waitFreed(t, c.u, 25*mib-4096) // parts 1..5 end by checkpoint 4 (26 MiB)
	if err := c.sw.Close(stream.EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	if err := c.ref.Close(stream.EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	if err := c.u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	final := wait(t, c.u, 60*time.Second)
	if final.State != upload.StateComplete || !final.LocalDeleted {
		t.Fatalf("status %+v", final)
	}
	want, err := os.ReadFile(c.refPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := uploadOf(t, f, "run/a/f.strap"); !bytes.Equal(got, want) {
		t.Fatalf("object (%d bytes) differs from the stream written (%d bytes)", len(got), len(want))
	}
	if _, err := os.Stat(c.path); !os.IsNotExist(err) {
		t.Fatalf("local stream not deleted (FreeLocal implies KeepLocal=false): %v", err)
	}
	if names, _ := filepath.Glob(filepath.Join(f.state, "*")); len(names) != 0 {
		t.Fatalf("state or journal left: %v", names)
	}
}

func uploadOf(t *testing.T, f *fixture, key string) []byte {
	t.Helper()
	out, err := f.client.S3().GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("caps"), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(out.Body); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestFreeLocalUnsupportedFileSystem: a file system that cannot punch holes: a clear error
// in status, nothing recorded as freed, the capture and the upload go on, the object exact.
func TestFreeLocalUnsupportedFileSystem(t *testing.T) {
	restore := upload.SetPunchHole(func(*os.File, int64, int64) error { return unix.EOPNOTSUPP })
	f := newFixture(t)
	m := f.freeManager(t)
	t.Cleanup(func() { m.Close(); restore() })
	c := startFree(t, f, m, "n.strap")
	c.writeTo(4 * mib)
	c.checkpoint()
	c.writeTo(12 * mib)
	c.checkpoint()
	c.writeTo(17 * mib)
	c.checkpoint()
	deadline := time.Now().Add(60 * time.Second)
	for c.u.Status().FreeError == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no free error after 60 s: %+v", c.u.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := c.u.Status()
	if !strings.Contains(st.FreeError, "cannot free parts of a file") || st.FreedBytes != 0 || st.State == upload.StateLost {
		t.Fatalf("status %+v", st)
	}
	if s := readState(t, f.state); s.FreedFrom != 0 || s.FreedTo != 0 {
		t.Fatalf("state records [%d, %d) freed, nothing was", s.FreedFrom, s.FreedTo)
	}
	if _, _, ok, _ := stream.FreedRange(c.file, 0, c.sw.Offset()); ok {
		t.Fatal("holes in the file")
	}
	c.writeTo(20 * mib)
	for _, w := range []*stream.Writer{c.sw, c.ref} {
		if err := w.Close(stream.EndInfo{Status: "complete"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if final := wait(t, c.u, 60*time.Second); final.State != upload.StateComplete {
		t.Fatalf("%+v", final)
	}
	want, _ := os.ReadFile(c.refPath)
	if got := uploadOf(t, f, "run/a/n.strap"); !bytes.Equal(got, want) {
		t.Fatal("object differs")
	}
}

// TestFreeLocalResume: strapd stops mid-capture after freeing; a resume must go on with
// the same object, at or past the freed range, and gets the journal cut back to it; a part
// in the freed range that the server lost is a final "lost" state naming the range.
func TestFreeLocalResume(t *testing.T) {
	f := newFixture(t)
	m := f.freeManager(t)
	c := startFree(t, f, m, "r.strap")
	freedUpTo10MiB(t, c)
	m.Close() // strapd killed mid-capture: no Finish
	cks := c.ckpts

	m2 := f.freeManager(t)
	if err := m2.ResumePending(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.tryBegin(m2, cks[1].Offset, upload.Target{Bucket: "caps", Prefix: "elsewhere"}); err == nil ||
		!strings.Contains(err.Error(), "same object") {
		t.Fatalf("resume to another target: %v", err)
	}
	if _, err := c.tryBegin(m2, cks[0].Offset, upload.Target{Bucket: "caps", Prefix: "run/a"}); err == nil ||
		!strings.Contains(err.Error(), "freed") {
		t.Fatalf("resume before the freed range's end: %v", err)
	}
	u2 := c.begin(t, m2, cks[1].Offset, upload.Target{Bucket: "caps", Prefix: "run/a"})
	j := u2.Journal()
	if j == nil || j.End() != cks[1].Offset || len(j.Entries) != int(cks[1].Packets) {
		t.Fatalf("journal for the resume: %+v", j)
	}
	if on := readJournal(t, f.state); on.End() != cks[1].Offset {
		t.Fatalf("journal file not cut back to the resume point: ends at %d", on.End())
	}
	if st := u2.Status(); st.FreedBytes != 10*mib-4096 || st.Parts != 2 {
		t.Fatalf("resumed upload %+v", st)
	}
	u2.Abandon()
	m2.Close()

	// A recorded part that differs from the server's (here its ETag, edited in the state
	// file) would be sent again: inside the freed range it cannot be.
	names, _ := filepath.Glob(filepath.Join(f.state, "upload-*.json"))
	orig, err := os.ReadFile(names[0])
	if err != nil {
		t.Fatal(err)
	}
	edited := readState(t, f.state)
	edited.Parts[1].ETag = `"0123456789abcdef0123456789abcdef"`
	b, _ := json.Marshal(edited)
	if err := os.WriteFile(names[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	mx := f.freeManager(t)
	ux := c.begin(t, mx, cks[1].Offset, upload.Target{Bucket: "caps", Prefix: "run/a"})
	select {
	case <-ux.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("upload not ended: %+v", ux.Status())
	}
	if s := ux.Status(); s.State != upload.StateLost || s.Lost != "[5242880, 10485760)" || !strings.Contains(s.LastError, "part 2 is missing on the server or differs") {
		t.Fatalf("status %+v", s)
	}
	mx.Close()
	if err := os.WriteFile(names[0], orig, 0o600); err != nil {
		t.Fatal(err)
	}

	// The server forgets the multipart upload (an abort, a lifecycle rule): the freed
	// parts cannot be sent again.
	st := readState(t, f.state)
	if _, err := f.client.S3().AbortMultipartUpload(context.Background(), &s3.AbortMultipartUploadInput{
		Bucket: aws.String("caps"), Key: aws.String(st.Key), UploadId: aws.String(st.UploadID)}); err != nil {
		t.Fatal(err)
	}
	m3 := f.freeManager(t)
	u3 := c.begin(t, m3, cks[1].Offset, upload.Target{Bucket: "caps", Prefix: "run/a"})
	select {
	case <-u3.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("upload not ended: %+v", u3.Status())
	}
	lost := u3.Status()
	if lost.State != upload.StateLost || lost.Lost != "[4096, 10485760)" || !strings.Contains(lost.LastError, "lost") ||
		!strings.Contains(lost.LastError, "no longer knows the multipart upload") {
		t.Fatalf("status %+v", lost)
	}
	found := false
	for _, s := range m3.Status() {
		found = found || (s.State == upload.StateLost && s.Lost == lost.Lost)
	}
	if !found {
		t.Fatalf("status list does not show the lost upload: %+v", m3.Status())
	}
	// The state is kept (a record of what is lost), still naming the freed range.
	if s := readState(t, f.state); s.FreedTo != 10*mib {
		t.Fatalf("state %+v", s)
	}
	b, _ = json.Marshal(lost)
	t.Logf("lost: %s", b)
}

// TestParseStateFreedRange: the freed range a state file records must be 4 KiB aligned and
// lie inside its acknowledged parts (those can never be sent again).
func TestParseStateFreedRange(t *testing.T) {
	base := `{"version":1,"bucket":"caps","key":"k/s.strap","upload_id":"u1","part_size":5242880,"path":"/d/s.strap",` +
		`"dev":1,"ino":2,"uid":0,"final_size":-1,"keep_local":false,"sides":null,` +
		`"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAAAAA=="}]%s}`
	for _, tc := range []struct {
		freed string
		ok    bool
	}{
		{``, true},
		{`,"freed_from":4096,"freed_to":5242880`, true},
		{`,"freed_from":4096,"freed_to":5246976`, false}, // past the parts
		{`,"freed_from":4000,"freed_to":8192`, false},    // not aligned
		{`,"freed_from":8192,"freed_to":4096`, false},    // backwards
		{`,"freed_from":4096`, false},                    // from without to
	} {
		_, err := upload.ParseState([]byte(strings.Replace(base, "%s", tc.freed, 1)))
		if (err == nil) != tc.ok {
			t.Errorf("freed %q: %v", tc.freed, err)
		}
	}
}

// TestFreeLocalServerForgetsUploadMidCapture: the server drops the multipart upload while
// the capture goes on (an abort, a lifecycle rule): the next part fails, the upload compares
// its parts with the server's, and the freed ones being gone it ends "lost", naming them.
func TestFreeLocalServerForgetsUploadMidCapture(t *testing.T) {
	f := newFixture(t)
	m := f.freeManager(t)
	c := startFree(t, f, m, "g.strap")
	freedUpTo10MiB(t, c)
	waitUploaded(t, c.u, 15*mib)
	st := readState(t, f.state)
	if _, err := f.client.S3().AbortMultipartUpload(context.Background(), &s3.AbortMultipartUploadInput{
		Bucket: aws.String("caps"), Key: aws.String(st.Key), UploadId: aws.String(st.UploadID)}); err != nil {
		t.Fatal(err)
	}
	c.writeTo(24 * mib)
	c.checkpoint()
	select {
	case <-c.u.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("upload not ended: %+v", c.u.Status())
	}
	if s := c.u.Status(); s.State != upload.StateLost || !strings.HasPrefix(s.Lost, "[4096, ") || !strings.Contains(s.LastError, "no longer knows") {
		t.Fatalf("status %+v", s)
	}
}

// A verification whose HEAD request fails (the server refuses it for a while; here a proxy
// answers 403) is not a wrong object: with bytes freed it must not end the upload "lost".
// The next attempt completes again (the server answers NoSuchUpload for a completed upload)
// and verifies again; the object equals the stream written.
func TestFreeLocalVerifyRequestFailureIsRetried(t *testing.T) {
	f := newFixture(t)
	var refuseHead atomic.Bool
	var refused atomic.Int32
	target, err := url.Parse(f.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead && refuseHead.Load() {
			refused.Add(1)
			w.WriteHeader(http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	client, err := upload.NewClient(context.Background(), upload.ClientOptions{Endpoint: proxy.URL})
	if err != nil {
		t.Fatal(err)
	}
	m := f.managerFor(t, client, true, true)
	c := startFree(t, f, m, "v.strap")
	freedUpTo10MiB(t, c)
	for _, w := range []*stream.Writer{c.sw, c.ref} {
		if err := w.Close(stream.EndInfo{Status: "complete"}); err != nil {
			t.Fatal(err)
		}
	}
	refuseHead.Store(true)
	if err := c.u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for refused.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s := c.u.Status(); refused.Load() < 2 || s.State == upload.StateLost || s.State == upload.StateComplete {
		t.Fatalf("with HEAD refused %d times: %+v", refused.Load(), s)
	}
	refuseHead.Store(false)
	final := wait(t, c.u, 60*time.Second)
	if final.State != upload.StateComplete || final.Lost != "" {
		t.Fatalf("status %+v", final)
	}
	want, err := os.ReadFile(c.refPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := uploadOf(t, f, "run/a/v.strap"); !bytes.Equal(got, want) {
		t.Fatalf("object (%d bytes) differs from the stream written (%d bytes)", len(got), len(want))
	}
}

// The punching descriptor is the client's file description, which holds the stream's lock
// (CHECKPOINTS.md 5): an upload abandoned before its session ended (an OPEN that failed
// after the upload began) must close it, or every later capture of the file would wait on
// a lock nobody releases.
func TestFreeLocalAbandonReleasesTheStreamLock(t *testing.T) {
	f := newFixture(t)
	m := f.freeManager(t)
	path := filepath.Join(f.dir, "l.strap")
	if err := os.WriteFile(path, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	punch, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(punch.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	u, err := m.Begin(upload.Stream{File: r, Path: path, Target: upload.Target{Bucket: "caps", Prefix: "run/a"}, Punch: punch})
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		t.Fatal("the lock was free while the upload held the descriptor")
	}
	u.Abandon()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("the stream's lock is still held after the upload was abandoned: %v", err)
	}
}
