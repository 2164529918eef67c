package upload_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap/zaptest"

	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
)

// holdProxy stands between strapd's client and the S3 server: it forwards every request,
// counts the ones that send bytes, and, while hold is set, forwards a
// CompleteMultipartUpload to the server but withholds the server's answer (the window in
// which a strapd killed has the object completed on the server and not in its state).
type holdProxy struct {
	URL            string
	hold           atomic.Bool
	held           chan struct{} // closed when an answer is withheld
	heldOnce       sync.Once
	parts, creates atomic.Int32 // UploadPart and CreateMultipartUpload requests forwarded
	copies, gets   atomic.Int32 // UploadPartCopy and GET requests forwarded
	completes      atomic.Int32
	// refuseHeads answers that many HEADs 403 (a verification whose request fails).
	refuseHeads atomic.Int32
	// beforeHead runs once, before the next HEAD is forwarded.
	beforeHead atomic.Pointer[func()]
	// Object writes (CreateMultipartUpload, PutObject): the headers of each, an
	// x-amz-server-side-encryption answer to add to their responses (a server that
	// implements SSE; VersityGW accepts the request headers and ignores them), or an error
	// to answer them with.
	mu          sync.Mutex
	writes      []http.Header
	confirmSSE  atomic.Pointer[string]
	refuseWrite atomic.Pointer[string]
	aborts      atomic.Int32
	// noChecksums strips the CRC32C from HEAD answers (a server that keeps none).
	noChecksums atomic.Bool
}

func isObjectWrite(r *http.Request) bool {
	q := r.URL.Query()
	return (r.Method == http.MethodPost && q.Has("uploads")) || (r.Method == http.MethodPut && !q.Has("partNumber"))
}

func newHoldProxy(t *testing.T, endpoint string) *holdProxy {
	target, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{held: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		if p.noChecksums.Load() && resp.Request.Method == http.MethodHead {
			resp.Header.Del("X-Amz-Checksum-Crc32c")
			resp.Header.Del("X-Amz-Checksum-Type")
		}
		if c := p.confirmSSE.Load(); c != nil && resp.StatusCode == http.StatusOK && isObjectWrite(resp.Request) {
			resp.Header.Set("X-Amz-Server-Side-Encryption", *c)
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if isObjectWrite(r) {
			p.mu.Lock()
			p.writes = append(p.writes, r.Header.Clone())
			p.mu.Unlock()
			if e := p.refuseWrite.Load(); e != nil {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(*e))
				return
			}
		}
		if r.Method == http.MethodDelete && q.Has("uploadId") {
			p.aborts.Add(1)
		}
		if r.Method == http.MethodHead && p.refuseHeads.Add(-1) >= 0 {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if r.Method == http.MethodHead {
			if fn := p.beforeHead.Swap(nil); fn != nil {
				(*fn)()
			}
		}
		switch {
		case r.Method == http.MethodPut && q.Has("partNumber") && r.Header.Get("X-Amz-Copy-Source") != "":
			p.copies.Add(1)
		case r.Method == http.MethodPut && q.Has("partNumber"):
			p.parts.Add(1)
		case r.Method == http.MethodGet && !q.Has("uploadId"):
			p.gets.Add(1)
		case r.Method == http.MethodPost && q.Has("uploads"):
			p.creates.Add(1)
		case r.Method == http.MethodPost && q.Has("uploadId"):
			p.completes.Add(1)
			if p.hold.Load() {
				rec := httptest.NewRecorder()
				rp.ServeHTTP(rec, r) // the server completes the object
				p.heldOnce.Do(func() { close(p.held) })
				<-r.Context().Done() // the client gave up (strapd stopped): it never hears
				if hj, ok := w.(http.Hijacker); ok {
					if c, _, err := hj.Hijack(); err == nil {
						c.Close()
					}
				}
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *holdProxy) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-p.held:
	case <-time.After(60 * time.Second):
		t.Fatal("no CompleteMultipartUpload within 60 s")
	}
}

func (f *fixture) managerVia(t *testing.T, endpoint string, freeLocal bool) *upload.Manager {
	return f.managerWith(t, endpoint, !freeLocal, freeLocal)
}

func (f *fixture) managerWith(t *testing.T, endpoint string, keepLocal, freeLocal bool) *upload.Manager {
	client, err := upload.NewClient(context.Background(), upload.ClientOptions{Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	return f.managerFor(t, client, keepLocal, freeLocal)
}

// managerFor is the tests' manager (minimum part size, two parts at once, short backoffs)
// over client, closed when the test ends.
func (f *fixture) managerFor(t *testing.T, client *upload.Client, keepLocal, freeLocal bool) *upload.Manager {
	m, err := upload.NewManager(upload.Options{Client: client, StateDir: f.state, PartSize: upload.MinPartSize,
		Concurrency: 2, KeepLocal: keepLocal, FreeLocal: freeLocal, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestCompletedBeforeRecordedSurvivesRestart: strapd stops after the server completed the
// object but before strapd heard so. The restarted strapd finds the multipart upload gone,
// verifies the object against the parts its state recorded before completing, and ends
// complete: nothing is sent again, and with the local bytes freed nothing is lost.
func TestCompletedBeforeRecordedSurvivesRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		free bool
		// refuseHeads: the restarted strapd's first verifications fail as requests (not
		// a wrong object): it must ask again, not take the freed bytes for lost.
		refuseHeads int32
		// noChecksums: the server reports no CRC32C, so the object is read back.
		noChecksums bool
	}{{"kept local", false, 0, false}, {"freed local", true, 0, false}, {"freed local, HEAD refused after the restart", true, 3, false},
		{"freed local, server without checksums", true, 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			proxy := newHoldProxy(t, f.srv.Endpoint)
			m := f.managerVia(t, proxy.URL, tc.free)
			c := startFree(t, f, m, "c.strap")
			if tc.free {
				freedUpTo10MiB(t, c)
			} else {
				c.writeTo(12*mib + 4321)
			}
			for _, w := range []*stream.Writer{c.sw, c.ref} {
				if err := w.Close(stream.EndInfo{Status: "complete"}); err != nil {
					t.Fatal(err)
				}
			}
			proxy.hold.Store(true)
			if err := c.u.Finish(nil); err != nil {
				t.Fatal(err)
			}
			proxy.waitHeld(t)
			m.Close() // strapd stops in the window
			if st := readState(t, f.state); !st.Completing || st.Tail == nil {
				t.Fatalf("state before the restart does not record the completion: %+v", st)
			}
			want, err := os.ReadFile(c.refPath)
			if err != nil {
				t.Fatal(err)
			}
			if got := uploadOf(t, f, "run/a/c.strap"); !bytes.Equal(got, want) {
				t.Fatal("the server did not complete the object in the window")
			}
			parts, creates := proxy.parts.Load(), proxy.creates.Load()

			proxy.hold.Store(false)
			proxy.refuseHeads.Store(tc.refuseHeads)
			proxy.noChecksums.Store(tc.noChecksums)
			gets := proxy.gets.Load()
			m2 := f.managerVia(t, proxy.URL, tc.free)
			if err := m2.ResumePending(); err != nil {
				t.Fatal(err)
			}
			final := waitEnded(t, m2)
			if n := proxy.refuseHeads.Load(); n > 0 {
				t.Fatalf("only %d of %d HEADs were refused", tc.refuseHeads-n, tc.refuseHeads)
			}
			if final.State != upload.StateComplete || final.Lost != "" || final.UploadedBytes != int64(len(want)) ||
				(tc.refuseHeads > 0) != (final.Errors > 0) {
				t.Fatalf("status after the restart: %+v", final)
			}
			if proxy.parts.Load() != parts || proxy.creates.Load() != creates {
				t.Fatalf("sent again after the restart: %d parts, %d new uploads", proxy.parts.Load()-parts, proxy.creates.Load()-creates)
			}
			if readBack := proxy.gets.Load() - gets; tc.noChecksums != strings.Contains(final.Verified, "read back") ||
				(tc.noChecksums && readBack != int32(final.Parts)) || (!tc.noChecksums && readBack != 0) {
				t.Fatalf("verified %q with %d ranged GETs", final.Verified, readBack)
			}
			if got := uploadOf(t, f, "run/a/c.strap"); !bytes.Equal(got, want) {
				t.Fatal("object differs from the stream written")
			}
			_, err = os.Stat(c.path)
			if deleted := os.IsNotExist(err); deleted != tc.free || final.LocalDeleted != tc.free {
				t.Fatalf("local stream deleted %v (status %v), want %v", deleted, final.LocalDeleted, tc.free)
			}
			if names, _ := filepath.Glob(filepath.Join(f.state, "*")); len(names) != 0 {
				t.Fatalf("state left: %v", names)
			}
		})
	}
}

// replaceObject overwrites the object on the server (not through the proxy) with body; with
// sum, the PUT carries its CRC32C, which the server then reports for the object.
func replaceObject(t *testing.T, f *fixture, key string, body []byte, sum bool) {
	in := &s3.PutObjectInput{Bucket: aws.String("caps"), Key: aws.String(key), Body: bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body)))}
	if sum {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
		in.ChecksumCRC32C = aws.String(base64.StdEncoding.EncodeToString(b[:]))
	}
	if _, err := f.client.S3().PutObject(context.Background(), in); err != nil {
		t.Error(err)
	}
}

// TestWrongObjectAtVerification: the object on the server is not the one strapd completed
// (someone replaced it with other bytes of the same size, or of another size) when strapd
// verifies it, right after completing it or after a restart in the window of
// TestCompletedBeforeRecordedSurvivesRestart. With bytes freed locally the upload ends
// "lost", naming the freed range, never "complete"; with the local stream whole, the
// object is sent anew and ends complete and equal to the stream.
func TestWrongObjectAtVerification(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart bool // replaced while strapd was stopped after the server completed it
		size    int  // the replacement's size relative to the stream's
		sum     bool // the replacement carries a CRC32C (the server reports it)
		why     string
	}{
		{"after completing, same size, CRC32C", false, 0, true, "its CRC32C is"},
		{"after completing, shorter", false, -1000, false, "the object has"},
		{"after a restart, same size, no checksum", true, 0, false, "read back have CRC32C"},
		{"after a restart, longer", true, 1000, true, "the object has"},
	} {
		for _, free := range []bool{true, false} {
			name := tc.name + ", kept local"
			if free {
				name = tc.name + ", freed local"
			}
			t.Run(name, func(t *testing.T) {
				f := newFixture(t)
				proxy := newHoldProxy(t, f.srv.Endpoint)
				m := f.managerVia(t, proxy.URL, free)
				c := startFree(t, f, m, "w.strap")
				if free {
					freedUpTo10MiB(t, c)
				} else {
					c.writeTo(17 * mib)
				}
				for _, w := range []*stream.Writer{c.sw, c.ref} {
					if err := w.Close(stream.EndInfo{Status: "complete"}); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(c.refPath)
				if err != nil {
					t.Fatal(err)
				}
				other := randomBytes(len(want)+tc.size, 99)
				replace := func() { replaceObject(t, f, "run/a/w.strap", other, tc.sum) }
				if tc.restart {
					proxy.hold.Store(true)
				} else {
					proxy.beforeHead.Store(&replace)
				}
				if err := c.u.Finish(nil); err != nil {
					t.Fatal(err)
				}
				if tc.restart {
					proxy.waitHeld(t)
					m.Close()
					replace()
					proxy.hold.Store(false)
					m2 := f.managerVia(t, proxy.URL, free)
					if err := m2.ResumePending(); err != nil {
						t.Fatal(err)
					}
					m = m2
				}
				final := waitEnded(t, m)
				got := uploadOf(t, f, "run/a/w.strap")
				if free {
					if final.State != upload.StateLost || final.Lost != "[4096, 10485760)" || !strings.Contains(final.LastError, tc.why) {
						t.Fatalf("status %+v", final)
					}
					if _, err := os.Stat(c.path); err != nil {
						t.Fatalf("the local stream of a lost upload is gone: %v", err)
					}
					if st := readState(t, f.state); st.FreedTo != 10*mib {
						t.Fatalf("state %+v", st)
					}
					if !bytes.Equal(got, other) {
						t.Fatal("the wrong object was overwritten: nothing may be completed once bytes are lost")
					}
					return
				}
				if final.State != upload.StateComplete || final.Lost != "" {
					t.Fatalf("status %+v", final)
				}
				if n := proxy.creates.Load(); n != 2 {
					t.Fatalf("%d multipart uploads: the wrong object was not sent anew", n)
				}
				if !bytes.Equal(got, want) {
					t.Fatal("object differs from the stream written")
				}
			})
		}
	}
}

// waitEnded is the manager's one upload once it is complete or lost.
func waitEnded(t *testing.T, m *upload.Manager) upload.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		sts := m.Status()
		if len(sts) == 1 && (sts[0].State == upload.StateComplete || sts[0].State == upload.StateLost) {
			return sts[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ended after 60 s: %+v", sts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFreeLocalAbortedCompletesAndResumes: a session that ends aborted after bytes of its
// stream were freed: its object is completed with the whole stream (so it is in the bucket,
// not only in an incomplete multipart upload) and the state and index journal are kept; the
// capture's resume on this host starts a new multipart upload whose freed parts are made
// from that object (the local file holds zeros there) and ends with an object equal to an
// uninterrupted capture. With "while completing", the resume comes while the aborted
// object's completion is in flight (the server completed it; strapd did not hear so).
func TestFreeLocalAbortedCompletesAndResumes(t *testing.T) {
	for _, tc := range []struct {
		name            string
		whileCompleting bool
		// perSession: freeing was the aborted session's own (upload_free_local) and the
		// resumed session does not ask for it, on a daemon without the option.
		perSession bool
		// spoil: the aborted object is "replaced" (other bytes) or "deleted" before the
		// resume: the freed bytes are then lost.
		spoil string
	}{{"after completion", false, false, ""}, {"while completing", true, false, ""}, {"per session, resumed without freeing", false, true, ""},
		{"object replaced before the resume", false, false, "replaced"}, {"object deleted before the resume", false, false, "deleted"}} {
		whileCompleting := tc.whileCompleting
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			proxy := newHoldProxy(t, f.srv.Endpoint)
			m := f.managerVia(t, proxy.URL, true)
			if tc.perSession {
				m = f.managerWith(t, proxy.URL, false, false) // serve --upload-keep-local=false
			}
			c := startFreeWith(t, f, m, "a.strap", tc.perSession)
			freedUpTo10MiB(t, c)
			ck := c.checkpoint()
			// The client dies: strapd ends the stream aborted after the last packet.
			c.writeTo(ck.Offset + 300<<10)
			if err := c.sw.Close(stream.EndInfo{Status: "aborted"}); err != nil {
				t.Fatal(err)
			}
			aborted, err := os.ReadFile(c.path)
			if err != nil {
				t.Fatal(err)
			}
			c.u.KeepLocal()
			if whileCompleting {
				proxy.hold.Store(true)
			}
			if err := c.u.Finish(nil); err != nil {
				t.Fatal(err)
			}
			st := readState(t, f.state)
			if whileCompleting {
				proxy.waitHeld(t)
			} else {
				final := wait(t, c.u, 60*time.Second)
				if final.State != upload.StateComplete || final.LocalDeleted || final.Lost != "" {
					t.Fatalf("aborted session's upload: %+v", final)
				}
				st = readState(t, f.state)
				if st.Completed == "" || st.FreedTo < 10*mib {
					t.Fatalf("state kept for the resume: %+v", st)
				}
				readJournal(t, f.state)
			}
			// The object is the whole aborted stream: its freed bytes are the reference's.
			ref, err := os.ReadFile(c.refPath)
			if err != nil {
				t.Fatal(err)
			}
			want := append([]byte(nil), aborted...)
			copy(want[st.FreedFrom:st.FreedTo], ref[st.FreedFrom:st.FreedTo])
			if got := uploadOf(t, f, "run/a/a.strap"); !bytes.Equal(got, want) {
				t.Fatalf("the aborted stream's object (%d bytes) is not the stream (%d bytes)", len(got), len(want))
			}

			switch tc.spoil {
			case "replaced":
				replaceObject(t, f, "run/a/a.strap", randomBytes(len(want), 7), true)
			case "deleted":
				if _, err := f.client.S3().DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String("caps"),
					Key: aws.String("run/a/a.strap")}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.spoil != "" {
				if err := c.file.Truncate(ck.Offset); err != nil {
					t.Fatal(err)
				}
				u2 := c.begin(t, m, ck.Offset, upload.Target{Bucket: "caps", Prefix: "run/a"})
				final := wait(t, u2, 60*time.Second)
				if final.State != upload.StateLost || final.Lost != fmt.Sprintf("[4096, %d)", st.FreedTo) ||
					!strings.Contains(final.LastError, "changed or is gone") {
					t.Fatalf("resume from a %s object: %+v", tc.spoil, final)
				}
				t.Logf("%s: %s", tc.spoil, final.LastError)
				return
			}
			// The resume: the file cut back to the last checkpoint, the capture goes on.
			if err := c.file.Truncate(ck.Offset); err != nil {
				t.Fatal(err)
			}
			proxy.hold.Store(false)
			parts, copies := proxy.parts.Load(), proxy.copies.Load()
			c.perSession = false
			u2 := c.begin(t, m, ck.Offset, upload.Target{Bucket: "caps", Prefix: "run/a"})
			if j := u2.Journal(); j == nil || j.End() != ck.Offset {
				t.Fatalf("journal for the resume: %+v", j)
			}
			for c.ref.Offset() < 30*mib { // the capture goes on: the reference's next packets
				c.seq++
				data := randomBytes(256<<10, c.seq)
				p := stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(len(data))},
					RawLen: uint64(len(data)), Seq: c.seq, Step: c.seq / 4, Forward: c.seq / 4}, Name: "layer", Blocks: []stream.Block{{Data: data}}}
				if err := c.ref.WritePacket(&p); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.ref.Close(stream.EndInfo{Status: "complete"}); err != nil {
				t.Fatal(err)
			}
			ref, err = os.ReadFile(c.refPath)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.file.WriteAt(ref[ck.Offset:], ck.Offset); err != nil {
				t.Fatal(err)
			}
			if err := c.file.Sync(); err != nil {
				t.Fatal(err)
			}
			u2.Durable(int64(len(ref)))
			u2.RemoveBeside("a.strap.ckpt.json")
			if err := u2.Finish(nil); err != nil {
				t.Fatal(err)
			}
			final := wait(t, u2, 60*time.Second)
			if final.State != upload.StateComplete || !final.LocalDeleted {
				t.Fatalf("resumed upload: %+v", final)
			}
			if got := uploadOf(t, f, "run/a/a.strap"); !bytes.Equal(got, ref) {
				t.Fatalf("the resumed capture's object (%d bytes) differs from an uninterrupted capture's (%d bytes)", len(got), len(ref))
			}
			// The parts with freed bytes are made from the object (VersityGW's copy of a
			// part cannot be checked, so read back), never from the file's zeros.
			wantCopied := uint64((st.FreedTo + upload.MinPartSize - 1) / upload.MinPartSize * upload.MinPartSize)
			if proxy.copies.Load() == copies || m.CopiedBytes() != wantCopied {
				t.Fatalf("%d copies, %d bytes re-created from the object", proxy.copies.Load()-copies, m.CopiedBytes())
			}
			t.Logf("after the resume: %d UploadPart, %d UploadPartCopy", proxy.parts.Load()-parts, proxy.copies.Load()-copies)
			if names, _ := filepath.Glob(filepath.Join(f.state, "*")); len(names) != 0 {
				t.Fatalf("state or journal left: %v", names)
			}
		})
	}
}

// TestServerSideEncryption: with ClientOptions.SSE every object write (the stream's
// CreateMultipartUpload, each side file's PutObject) asks for it, and the server must
// confirm it in its answer. VersityGW 1.8.0 takes the headers and ignores them: the proxy
// adds the confirmation a server implementing SSE sends, or answers with a refusal. Not
// confirmed, or refused: a clear error, nothing sent into an upload that would not be
// encrypted (the multipart upload is aborted), the local file kept, the upload retried.
func TestServerSideEncryption(t *testing.T) {
	for _, tc := range []struct {
		name, sse, key string
		confirm        string // the answer's x-amz-server-side-encryption ("": none)
		refuse         string // an error body for object writes
		why            string // the status's last error; "": the upload completes
	}{
		{name: "AES256 confirmed", sse: upload.SSEAES256, confirm: "AES256"},
		{name: "aws:kms with a key, confirmed", sse: upload.SSEKMS, key: "alias/strap-captures", confirm: "aws:kms"},
		{name: "not confirmed", sse: upload.SSEAES256, why: "did not confirm server-side encryption AES256: its answer names none"},
		{name: "another algorithm confirmed", sse: upload.SSEAES256, confirm: "aws:kms", why: "its answer names aws:kms"},
		{name: "KMS key refused", sse: upload.SSEKMS, key: "alias/none",
			refuse: `<Error><Code>KMS.NotFoundException</Code><Message>Invalid keyId alias/none</Message></Error>`,
			why:    "the KMS key for server-side encryption was refused (KMS.NotFoundException"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			proxy := newHoldProxy(t, f.srv.Endpoint)
			if tc.confirm != "" {
				proxy.confirmSSE.Store(&tc.confirm)
			}
			if tc.refuse != "" {
				proxy.refuseWrite.Store(&tc.refuse)
			}
			client, err := upload.NewClient(context.Background(), upload.ClientOptions{Endpoint: proxy.URL, SSE: tc.sse, SSEKMSKeyID: tc.key})
			if err != nil {
				t.Fatal(err)
			}
			m := f.managerFor(t, client, false, false)
			w, u := f.begin(t, m, "e.strap", 0)
			data := randomBytes(2*upload.MinPartSize+777, 5)
			if _, err := w.Write(data); err != nil {
				t.Fatal(err)
			}
			side := filepath.Join(f.dir, "e.strap.trace.jsonl")
			if err := os.WriteFile(side, []byte(`{"event":"x"}`+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			sf, err := os.Open(side)
			if err != nil {
				t.Fatal(err)
			}
			if err := u.Finish([]upload.SideFile{{File: sf, Path: side}}); err != nil {
				t.Fatal(err)
			}
			if tc.why == "" {
				final := wait(t, u, 60*time.Second)
				if final.State != upload.StateComplete || !final.LocalDeleted {
					t.Fatalf("status %+v", final)
				}
				if got := uploadOf(t, f, "run/a/e.strap"); !bytes.Equal(got, data) {
					t.Fatal("object differs from the file")
				}
				proxy.mu.Lock()
				writes := append([]http.Header(nil), proxy.writes...)
				proxy.mu.Unlock()
				if len(writes) != 2 { // the stream's multipart upload and the trace's PUT
					t.Fatalf("%d object writes", len(writes))
				}
				for i, h := range writes {
					if h.Get("X-Amz-Server-Side-Encryption") != tc.sse || h.Get("X-Amz-Server-Side-Encryption-Aws-Kms-Key-Id") != tc.key {
						t.Fatalf("write %d asked for SSE %q key %q: %v", i, h.Get("X-Amz-Server-Side-Encryption"),
							h.Get("X-Amz-Server-Side-Encryption-Aws-Kms-Key-Id"), h)
					}
				}
				return
			}
			deadline := time.Now().Add(30 * time.Second)
			for u.Status().Errors < 2 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			st := u.Status()
			if st.State != upload.StateRetrying || !strings.Contains(st.LastError, tc.why) || st.UploadedBytes != 0 {
				t.Fatalf("status %+v", st)
			}
			if proxy.parts.Load() != 0 {
				t.Fatalf("%d parts sent into an upload that would not be encrypted", proxy.parts.Load())
			}
			if tc.refuse == "" && proxy.aborts.Load() < proxy.creates.Load() {
				t.Fatalf("%d multipart uploads created, %d aborted", proxy.creates.Load(), proxy.aborts.Load())
			}
			if _, err := os.Stat(filepath.Join(f.dir, "e.strap")); err != nil {
				t.Fatalf("local file not kept: %v", err)
			}
			t.Logf("last error: %s", st.LastError)
		})
	}
}

// TestCheckSSE: the options strapd takes, and the ones it refuses before any request.
func TestCheckSSE(t *testing.T) {
	for _, tc := range []struct {
		o  upload.ClientOptions
		ok bool
	}{
		{upload.ClientOptions{}, true},
		{upload.ClientOptions{SSE: "AES256"}, true},
		{upload.ClientOptions{SSE: "aws:kms"}, true},
		{upload.ClientOptions{SSE: "aws:kms", SSEKMSKeyID: "arn:aws:kms:us-east-1:1:key/x"}, true},
		{upload.ClientOptions{SSE: "aws:kms:dsse"}, false},
		{upload.ClientOptions{SSE: "aes256"}, false},
		{upload.ClientOptions{SSE: "AES256", SSEKMSKeyID: "k"}, false},
		{upload.ClientOptions{SSEKMSKeyID: "k"}, false},
		{upload.ClientOptions{SSE: "aws:kms", SSEKMSKeyID: "k\n"}, false},
	} {
		if err := tc.o.CheckSSE(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.o, err)
		}
	}
}
