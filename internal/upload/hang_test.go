package upload_test

import (
	"bytes"
	"context"
	"errors"
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

	"github.com/strap-llm/strap/internal/upload"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

// quickClient is a client whose calls time out after 1 s (and parts of 5 MiB a few ms
// later): a hung server shows within the tests' time.
func quickClient(t *testing.T, endpoint string) *upload.Client {
	t.Helper()
	c, err := upload.NewClient(context.Background(), upload.ClientOptions{Endpoint: endpoint, Timeout: time.Second, MinRate: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// openUploads lists the bucket's multipart uploads nobody completed or aborted.
func openUploads(t *testing.T, c *upload.Client) []string {
	t.Helper()
	out, err := c.S3().ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String("caps")})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, u := range out.Uploads {
		keys = append(keys, aws.ToString(u.Key)+" "+aws.ToString(u.UploadId))
	}
	return keys
}

func stateFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "upload-*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestHungServerFinishedCaptureCompletes: the S3 server hangs (SIGSTOP) while a capture's
// parts go; the capture ends. Its end is in the state file at once, though the upload is
// blocked on the server; the calls time out and count as errors, status says stalled;
// strapd stops. Once the server goes on, the next strapd completes the object by itself
// (byte for byte), and leaves no multipart upload, state file or entry but the complete one.
func TestHungServerFinishedCaptureCompletes(t *testing.T) {
	f := newFixture(t)
	t.Cleanup(f.srv.Thaw)
	m := f.managerFor(t, quickClient(t, f.srv.Endpoint), true, false)
	w, u := f.begin(t, m, "hung.strap", 0)
	data := randomBytes(3*upload.MinPartSize+4321, 41)
	write := func(to int) {
		t.Helper()
		if _, err := w.WriteAt(data[:to], 0); err != nil {
			t.Fatal(err)
		}
		u.Durable(int64(to))
	}
	write(2 * upload.MinPartSize)
	deadline := time.Now().Add(60 * time.Second)
	for u.Status().UploadedBytes < 2*upload.MinPartSize {
		if time.Now().After(deadline) {
			t.Fatalf("two parts not uploaded: %+v", u.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}

	f.srv.Freeze()
	write(len(data))
	time.Sleep(200 * time.Millisecond) // the third part is sent to the frozen server
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	st := readState(t, f.state)
	if st.FinalSize != int64(len(data)) {
		t.Fatalf("the stream's end is not in the state file right after Finish: final_size %d, want %d", st.FinalSize, len(data))
	}
	var s upload.Status
	for deadline = time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s = u.Status(); s.State == upload.StateStalled && s.Errors > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a hung server not shown as stalled with errors: %+v", s)
		}
	}
	if !strings.HasPrefix(s.LastError, "no answer from the server for") || !strings.Contains(s.LastError, "no answer from the server within") {
		t.Errorf("stalled status says %q", s.LastError)
	}
	m.Close() // strapd stops (its state file is all that is left of it)

	f.srv.Thaw()
	m2 := f.managerFor(t, quickClient(t, f.srv.Endpoint), true, false)
	if err := m2.ResumePending(); err != nil {
		t.Fatal(err)
	}
	end := waitEnded(t, m2)
	if end.State != upload.StateComplete {
		t.Fatalf("after the restart: %+v", end)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/hung.strap"); !bytes.Equal(got, data) {
		t.Fatalf("object differs from the file (%d vs %d bytes)", len(got), len(data))
	}
	if open := openUploads(t, f.client); len(open) != 0 {
		t.Errorf("multipart uploads left open: %v", open)
	}
	if left := stateFiles(t, f.state); len(left) != 0 {
		t.Errorf("state files left: %v", left)
	}
	if all := m2.Status(); len(all) != 1 || all[0].State != upload.StateComplete {
		t.Errorf("status after the restart: %+v", all)
	}
}

// TestUnansweredCreateIsAborted: the server carries out a CreateMultipartUpload but its
// answer never comes (a proxy withholds it): the call times out and is retried, and the
// multipart upload the first one made is aborted once the object is complete.
func TestUnansweredCreateIsAborted(t *testing.T) {
	f := newFixture(t)
	target, err := url.Parse(f.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var withheld atomic.Int32
	px := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Query().Has("uploads") && withheld.Add(1) == 1 {
			rp.ServeHTTP(httptest.NewRecorder(), r) // made on the server, never answered
			<-r.Context().Done()
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(px.Close)
	m := f.managerFor(t, quickClient(t, px.URL), true, false)
	w, u := f.begin(t, m, "orphan.strap", 0)
	data := randomBytes(upload.MinPartSize+999, 43)
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, u, 60*time.Second); s.State != upload.StateComplete || s.Errors == 0 {
		t.Fatalf("status %+v (want complete after a failed attempt)", s)
	}
	if withheld.Load() < 2 {
		t.Fatalf("%d creates: the unanswered one was not retried", withheld.Load())
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/orphan.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs from the file")
	}
	if open := openUploads(t, f.client); len(open) != 0 {
		t.Errorf("multipart uploads left open: %v", open)
	}
}

// TestKeyOfAnotherCaptureRefused: a key holding another capture's object is not
// overwritten (at Begin, or at completion when the other object came meanwhile); the same
// capture resumed overwrites its own.
func TestKeyOfAnotherCaptureRefused(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	first := randomBytes(upload.MinPartSize+100, 51)
	w, u := f.begin(t, m, "a.strap", 0)
	if _, err := w.Write(first); err != nil {
		t.Fatal(err)
	}
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, u, 60*time.Second); s.State != upload.StateComplete {
		t.Fatalf("first upload: %+v", s)
	}
	// Another capture, another file of the same name (another directory), the same key.
	other := filepath.Join(t.TempDir(), "a.strap")
	if err := os.WriteFile(other, randomBytes(2000, 52), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Begin(upload.Stream{File: r, Path: other, Target: upload.Target{Bucket: "caps", Prefix: "run/a"}})
	if !errors.Is(err, upload.ErrKeyTaken) || !strings.Contains(err.Error(), "s3://caps/run/a/a.strap") {
		t.Fatalf("second capture to the same key: %v, want ErrKeyTaken", err)
	}
	r.Close()

	// The race: the key is free when the second capture begins, the first completes
	// before the second does.
	f2 := filepath.Join(t.TempDir(), "b.strap")
	w2, err := os.OpenFile(f2, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	r2, err := os.Open(f2)
	if err != nil {
		t.Fatal(err)
	}
	u2, err := m.Begin(upload.Stream{File: r2, Path: f2, Target: upload.Target{Bucket: "caps", Prefix: "run/a"}})
	if err != nil {
		t.Fatal(err)
	}
	w3, u3 := f.begin(t, m, "b.strap", 0)
	third := randomBytes(upload.MinPartSize+7, 53)
	if _, err := w3.Write(third); err != nil {
		t.Fatal(err)
	}
	if err := u3.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, u3, 60*time.Second); s.State != upload.StateComplete {
		t.Fatalf("third upload: %+v", s)
	}
	if _, err := w2.Write(randomBytes(3000, 54)); err != nil {
		t.Fatal(err)
	}
	if err := u2.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, u2, 60*time.Second); s.State != upload.StateRefused || !strings.Contains(s.LastError, "another capture's object") {
		t.Fatalf("the capture that came second: %+v, want refused", s)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/b.strap"); !bytes.Equal(got, third) {
		t.Fatal("the object of the capture that completed first was overwritten")
	}

	// The first capture resumed (same file, its prefix kept) overwrites its own object.
	resumed := append(append([]byte(nil), first[:upload.MinPartSize]...), randomBytes(4000, 55)...)
	w4, u4 := f.begin(t, m, "a.strap", upload.MinPartSize)
	if _, err := w4.WriteAt(resumed, 0); err != nil {
		t.Fatal(err)
	}
	if err := w4.Truncate(int64(len(resumed))); err != nil {
		t.Fatal(err)
	}
	if err := u4.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, u4, 60*time.Second); s.State != upload.StateComplete {
		t.Fatalf("resumed upload: %+v", s)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/a.strap"); !bytes.Equal(got, resumed) {
		t.Fatal("the resumed capture's object is not its stream")
	}
	// The object names its capture (x-amz-meta-strap-capture), which the resume shares.
	head, err := f.client.S3().HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("caps"), Key: aws.String("run/a/a.strap")})
	if err != nil || len(head.Metadata["strap-capture"]) != 32 {
		t.Errorf("the object's capture metadata: %v (%v)", head.Metadata, err)
	}
	if open := openUploads(t, f.client); len(open) != 0 {
		t.Errorf("multipart uploads left open: %v", open)
	}
	if left := stateFiles(t, f.state); len(left) != 0 {
		t.Errorf("state files left: %v", left)
	}
}

// TestEndedStreamWithoutRecordedEnd: a state file that does not record the stream's end
// (a strapd before the end was recorded at once) of a stream that has ended (its footer):
// the restarted strapd completes the upload instead of waiting for a resume that will
// never come.
func TestEndedStreamWithoutRecordedEnd(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(f.dir, "ended.strap")
	data := writeStreamFile(t, path, 2*upload.MinPartSize+777)
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m := f.manager(t, true)
	u, err := m.Begin(upload.Stream{File: r, Path: path, Target: upload.Target{Bucket: "caps", Prefix: "run/a"}})
	if err != nil {
		t.Fatal(err)
	}
	u.Durable(upload.MinPartSize)
	for deadline := time.Now().Add(30 * time.Second); u.Status().Parts == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no part: %+v", u.Status())
		}
	}
	m.Close() // stopped before the end was recorded
	if st := readState(t, f.state); st.FinalSize != -1 {
		t.Fatalf("final_size %d, want -1 for this test", st.FinalSize)
	}
	m2 := f.manager(t, true)
	if err := m2.ResumePending(); err != nil {
		t.Fatal(err)
	}
	if end := waitEnded(t, m2); end.State != upload.StateComplete {
		t.Fatalf("after the restart: %+v", end)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/ended.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs from the stream")
	}
	if left := stateFiles(t, f.state); len(left) != 0 {
		t.Errorf("state files left: %v", left)
	}
}

// TestWaitingUploadFinishedByHand: strapd stopped mid-capture; the restarted one shows the
// upload waiting, suggesting nothing that cuts the stream; `strapd upload` of the file (the
// same state directory) uploads it as it is, aborts the multipart upload left behind, and
// the waiting entry goes with the state file.
func TestWaitingUploadFinishedByHand(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "mid.strap", 0)
	data := randomBytes(upload.MinPartSize+5000, 71)
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	u.Durable(int64(len(data)))
	for deadline := time.Now().Add(30 * time.Second); u.Status().Parts == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no part: %+v", u.Status())
		}
	}
	m.Close()
	m2 := f.manager(t, true)
	if err := m2.ResumePending(); err != nil {
		t.Fatal(err)
	}
	sts := m2.Status()
	if len(sts) != 1 || sts[0].State != upload.StateWaiting || !strings.Contains(sts[0].LastError, "strapd upload "+filepath.Join(f.dir, "mid.strap")) ||
		strings.Contains(sts[0].LastError, "resume_from_checkpoint") {
		t.Fatalf("waiting entry: %+v", sts)
	}
	path := filepath.Join(f.dir, "mid.strap")
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m3 := f.manager(t, true)
	byHand, err := m3.Begin(upload.Stream{File: r, Path: path, Target: upload.Target{Bucket: "caps", Prefix: "run/a"}, Final: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := byHand.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, byHand, 60*time.Second); s.State != upload.StateComplete {
		t.Fatalf("by hand: %+v", s)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/mid.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs from the file")
	}
	if sts := m2.Status(); len(sts) != 0 {
		t.Errorf("the daemon still shows %+v", sts)
	}
	if open := openUploads(t, f.client); len(open) != 0 {
		t.Errorf("multipart uploads left open: %v", open)
	}
	if left := stateFiles(t, f.state); len(left) != 0 {
		t.Errorf("state files left: %v", left)
	}
}

// TestConditionalCompleteKeepsObjectWrittenMeanwhile: another object lands on the key after
// strapd checked it and before its CompleteMultipartUpload arrives (a proxy writes it just
// then): the completion's If-None-Match: * makes the server refuse (VersityGW 1.8.0 checks
// it), and the upload ends refused, the other object intact and no multipart upload left.
func TestConditionalCompleteKeepsObjectWrittenMeanwhile(t *testing.T) {
	f := newFixture(t)
	target, err := url.Parse(f.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	other := randomBytes(1000, 81)
	rp := httputil.NewSingleHostReverseProxy(target)
	var completes, refused atomic.Int32
	px := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Query().Has("uploadId") && completes.Add(1) == 1 {
			if _, err := f.client.S3().PutObject(r.Context(), &s3.PutObjectInput{Bucket: aws.String("caps"),
				Key: aws.String("run/a/cond.strap"), Body: bytes.NewReader(other)}); err != nil {
				t.Errorf("put the other object: %v", err)
			}
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			if rec.Code == http.StatusPreconditionFailed {
				refused.Add(1)
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(px.Close)
	m := f.managerFor(t, quickClient(t, px.URL), true, false)
	w, u := f.begin(t, m, "cond.strap", 0)
	if _, err := w.Write(randomBytes(upload.MinPartSize+10, 82)); err != nil {
		t.Fatal(err)
	}
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, u, 60*time.Second); s.State != upload.StateRefused {
		t.Fatalf("status %+v, want refused", s)
	}
	if refused.Load() != 1 {
		t.Fatalf("the server did not refuse the conditional completion (%d completions)", completes.Load())
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/cond.strap"); !bytes.Equal(got, other) {
		t.Fatal("the object written meanwhile was replaced")
	}
	if open := openUploads(t, f.client); len(open) != 0 {
		t.Errorf("multipart uploads left open: %v", open)
	}
	if left := stateFiles(t, f.state); len(left) != 0 {
		t.Errorf("state files left: %v", left)
	}
}

// TestDamagedHeaderLengthStillUploads: a finished file that opens like a stream but whose
// header claims more metadata than the file holds is named by its first bytes (its
// capture id), not waited on: it uploads.
func TestDamagedHeaderLengthStillUploads(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "damaged.strap", 0)
	data := randomBytes(upload.MinPartSize/2, 91)
	copy(data, "STRAPSTM\x02\x00\x00\x00\xff\xff\xff\x7f")
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if s := wait(t, u, 30*time.Second); s.State != upload.StateComplete {
		t.Fatalf("status %+v", s)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/damaged.strap"); !bytes.Equal(got, data) {
		t.Fatal("object differs from the file")
	}
}
