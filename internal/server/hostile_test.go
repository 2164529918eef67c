package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// alongside runs a well-behaved capture while hostile runs, and checks that it finishes
// complete and bit-exact whatever the hostile client did.
func alongside(t *testing.T, ts *testServer, hostile func(t *testing.T)) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	started := make(chan struct{})
	go func() {
		defer wg.Done()
		c := ts.dial(t)
		out := outFile(t)
		st, _, err := controltest.OpenStream(c, shm.HeaderSize+128<<10, out, control.Open{Codec: "zstd", Policy: "block", BlockSize: 16 << 10})
		close(started)
		if err != nil {
			t.Errorf("good session: open: %v", err)
			return
		}
		var sent []shm.Tensor
		for i := range 60 {
			tn := tensor(fmt.Sprintf("model.layers.%d.mlp", i%4), uint64(i+1), 6000)
			if err := st.Put(&tn); err != nil {
				t.Errorf("good session: put %d: %v", i, err)
				return
			}
			sent = append(sent, tn)
			if i%10 == 0 {
				time.Sleep(time.Millisecond) // keep it alive while the hostile client works
			}
		}
		if _, err := st.Finish(); err != nil {
			t.Errorf("good session: close: %v", err)
			return
		}
		checkStream(t, out.Name(), sent, "complete")
	}()
	<-started
	hostile(t)
	wg.Wait()
}

// wantError waits for the fatal ERROR the daemon sends this client.
func wantError(t *testing.T, c *control.Client, code, sub string) {
	t.Helper()
	_ = c.Conn().Unix().SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.WaitRelease(1 << 60)
	var e *control.Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, sub) || !e.Fatal {
		t.Fatalf("err = %v, want fatal %s containing %q", err, code, sub)
	}
}

func memfd(t *testing.T, size int64, seals int) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "hostile")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// TestHostileRings: rings that could crash or fool the daemon are refused with a clear
// error while another session runs.
func TestHostileRings(t *testing.T) {
	ts := startServer(t, Config{})
	size := uint64(shm.HeaderSize + 64<<10)
	tests := []struct {
		name     string
		ring     func(t *testing.T) *os.File
		declared uint64
		code     string
		sub      string
	}{
		{"unsealed memfd", func(t *testing.T) *os.File { return memfd(t, int64(size), 0) }, size, control.CodeRingNotSealed, "F_SEAL_SHRINK"},
		{"shrinkable memfd (grow seal only)", func(t *testing.T) *os.File { return memfd(t, int64(size), unix.F_SEAL_GROW) }, size, control.CodeRingNotSealed, "F_SEAL_SHRINK"},
		{"growable memfd (shrink seal only)", func(t *testing.T) *os.File { return memfd(t, int64(size), unix.F_SEAL_SHRINK) }, size, control.CodeRingNotSealed, "F_SEAL_GROW"},
		{"memfd smaller than declared", func(t *testing.T) *os.File {
			p, err := shm.NewProducer(size, shm.ProducerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			return p.File()
		}, size + 64<<10, control.CodeRingSize, "memfd is"},
		{"sealed memfd without a ring header", func(t *testing.T) *os.File {
			return memfd(t, int64(size), unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
		}, size, control.CodeRingHeader, ""},
		{"ring is a socket", func(t *testing.T) *os.File { return socketFile(t) }, size, control.CodeRingNotSealed, "regular file"},
		{"ring is a directory", func(t *testing.T) *os.File { return dirFile(t) }, size, control.CodeRingNotSealed, "regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			alongside(t, ts, func(t *testing.T) {
				c := ts.dial(t)
				_, err := c.Open(tc.ring(t), outFile(t), control.Open{RingSize: tc.declared, Codec: "none", Policy: "block"})
				var e *control.Error
				if !errors.As(err, &e) || e.Code != tc.code || !strings.Contains(e.Message, tc.sub) {
					t.Fatalf("err = %v, want %s containing %q", err, tc.code, tc.sub)
				}
			})
		})
	}
	waitFor(t, func() bool {
		st := ts.srv.Status()
		return st.Daemon.Sessions == 0 && st.Daemon.MemoryUsed == idleStagingBytes(ts.srv)
	})
}

func socketFile(t *testing.T) *os.File {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}

func dirFile(t *testing.T) *os.File {
	f, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestHostileOutputs: output descriptors of the wrong kind are refused (the daemon writes
// only to a regular file the client opened for writing).
func TestHostileOutputs(t *testing.T) {
	ts := startServer(t, Config{})
	size := uint64(shm.HeaderSize + 64<<10)
	readOnly := func(t *testing.T) *os.File {
		f, err := os.Open(outFile(t).Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	oPath := func(t *testing.T) *os.File {
		fd, err := unix.Open(outFile(t).Name(), unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "opath")
		t.Cleanup(func() { f.Close() })
		return f
	}
	devNull := func(t *testing.T) *os.File {
		f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	tests := []struct {
		name string
		out  func(t *testing.T) *os.File
		sub  string
	}{
		{"socket", socketFile, "regular file"},
		{"directory", dirFile, "regular file"},
		{"read-only file", readOnly, "not open for writing"},
		{"O_PATH descriptor", oPath, ""},
		{"character device", devNull, "regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			alongside(t, ts, func(t *testing.T) {
				p, err := shm.NewProducer(size, shm.ProducerOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				c := ts.dial(t)
				_, err = c.Open(p.File(), tc.out(t), control.Open{RingSize: size, Codec: "none", Policy: "block"})
				var e *control.Error
				if !errors.As(err, &e) || e.Code != control.CodeBadOutput || !strings.Contains(e.Message, tc.sub) {
					t.Fatalf("err = %v, want bad_output containing %q", err, tc.sub)
				}
			})
		})
	}
}

// Record header offsets (PROTOCOL.md 2).
const (
	recDType      = 6
	recNDim       = 7
	recLen        = 16
	recPayloadOff = 40
	recPayloadLen = 48
	recNameLen    = 56
	recTensorLen  = 72
	recShape      = 80
)

// TestLyingRecords: records whose header lies are a fatal bad_record for that session only.
func TestLyingRecords(t *testing.T) {
	ts := startServer(t, Config{Limits: shm.Limits{MaxNDim: 4, MaxNameLen: 64}})
	le := binary.LittleEndian
	tests := []struct {
		name  string
		tn    shm.Tensor
		patch func(r []byte)
		sub   string
	}{
		{"payload_len past record_len", tensor("x", 1, 100), func(r []byte) { le.PutUint64(r[recPayloadLen:], 1<<20) }, ""},
		{"record_len past the window", tensor("x", 1, 100), func(r []byte) { le.PutUint64(r[recLen:], 1<<30) }, ""},
		{"record_len not a multiple of 64", tensor("x", 1, 100), func(r []byte) { le.PutUint64(r[recLen:], le.Uint64(r[recLen:])-1) }, ""},
		{"payload_off inside the header", tensor("x", 1, 100), func(r []byte) { le.PutUint64(r[recPayloadOff:], 64) }, ""},
		{"shape disagrees with tensor_len", tensor("x", 1, 100), func(r []byte) { le.PutUint64(r[recShape:], 101) }, "shape"},
		{"shape overflows", tensor("x", 1, 100), func(r []byte) { le.PutUint64(r[recShape:], 1<<62) }, "shape"},
		{"tensor_len disagrees with payload_len", tensor("x", 1, 100), func(r []byte) { le.PutUint64(r[recTensorLen:], 800) }, ""},
		{"unknown dtype", tensor("x", 1, 100), func(r []byte) { r[recDType] = 250 }, "dtype"},
		{"dtype size lies", tensor("x", 1, 100), func(r []byte) { r[recDType] = byte(dtype.Float16) }, ""},
		{"rank over --max-ndim", tensor("x", 1, 100), func(r []byte) { r[recNDim] = 5 }, "ndim"},
		{"name over --max-name-len", tensor("x", 1, 100), func(r []byte) { le.PutUint16(r[recNameLen:], 65) }, "name_len"},
		{"bad magic", tensor("x", 1, 100), func(r []byte) { r[0] = 'X' }, "magic"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			alongside(t, ts, func(t *testing.T) {
				c := ts.dial(t)
				out := outFile(t)
				st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, out, control.Open{Codec: "lz4", Policy: "block"})
				if err != nil {
					t.Fatal(err)
				}
				pos := st.P.Head()
				tn := tc.tn
				seq, err := st.P.Put(&tn)
				if err != nil {
					t.Fatal(err)
				}
				tc.patch(st.P.Mem()[shm.HeaderSize+pos:])
				if err := c.Publish(st.P.Head(), seq); err != nil {
					t.Fatal(err)
				}
				wantError(t, c, control.CodeBadRecord, tc.sub)
				// The session ended with status error and a stream that still reads.
				waitFor(t, func() bool {
					s, err := pipelineStream(out.Name())
					return err == nil && s == "error"
				})
			})
		})
	}
}

// TestTruncateSealedRing: a client that tries to shrink, grow or unseal its ring after
// OPEN fails (the seals hold), and punching a hole only zeroes pages: the daemon reads
// zeros (bad_record), never SIGBUS.
func TestTruncateSealedRing(t *testing.T) {
	ts := startServer(t, Config{})
	alongside(t, ts, func(t *testing.T) {
		c := ts.dial(t)
		out := outFile(t)
		st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, out, control.Open{Codec: "none", Policy: "block"})
		if err != nil {
			t.Fatal(err)
		}
		f := st.P.File()
		for _, size := range []int64{0, shm.HeaderSize, shm.HeaderSize + 128<<10} {
			if err := f.Truncate(size); !errors.Is(err, unix.EPERM) {
				t.Fatalf("ftruncate(%d) on a sealed ring: %v, want EPERM", size, err)
			}
		}
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, unix.EPERM) {
			t.Fatalf("adding seals after F_SEAL_SEAL: %v, want EPERM", err)
		}
		a := tensor("a", 1, 1000)
		if err := st.Put(&a); err != nil {
			t.Fatal(err)
		}
		// Punch out the data region and publish a record there.
		pos := st.P.Head()
		b := tensor("b", 2, 1000)
		seq, err := st.P.Put(&b)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
			int64(shm.HeaderSize+pos), int64(st.P.Head()-pos)); err != nil {
			t.Fatalf("punch hole: %v", err)
		}
		if err := c.Publish(st.P.Head(), seq); err != nil {
			t.Fatal(err)
		}
		wantError(t, c, control.CodeBadRecord, "magic")
		waitFor(t, func() bool { s, err := pipelineStream(out.Name()); return err == nil && s == "error" })
		checkStream(t, out.Name(), []shm.Tensor{a}, "error")
	})
}

// TestOpenFlood: one user opening sessions as fast as it can gets clear limit errors once
// its quota is used up; a session already running finishes bit-exact, and slots come back.
func TestOpenFlood(t *testing.T) {
	ts := startServer(t, Config{MaxSessions: 6, Clients: ClientLimits{MaxSessionsPerUID: 4, ConnectRate: 100, MaxConnsPerUID: 40}})
	size := uint64(shm.HeaderSize + 64<<10)
	var limited, opened, refusedAtConnect, refusedWithError int
	var mu sync.Mutex
	alongside(t, ts, func(t *testing.T) {
		var wg sync.WaitGroup
		var holders []*control.Client
		for range 300 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := dialErr(ts.sock)
				var e *control.Error
				if errors.As(err, &e) {
					mu.Lock()
					defer mu.Unlock()
					if e.Code != control.CodeLimit {
						t.Errorf("connect refused with %v, want limit", err)
					}
					refusedAtConnect++
					refusedWithError++
					return
				}
				if err != nil {
					// More than maxRefusing refusals at once are closed without a word.
					mu.Lock()
					defer mu.Unlock()
					refusedAtConnect++
					return
				}
				p, err := shm.NewProducer(size, shm.ProducerOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				defer p.Close()
				out, err := os.CreateTemp(t.TempDir(), "flood")
				if err != nil {
					t.Error(err)
					return
				}
				defer out.Close()
				_, err = c.Open(p.File(), out, control.Open{RingSize: size, Codec: "none", Policy: "block"})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					opened++
					holders = append(holders, c) // keep the session open
				case errors.As(err, &e) && e.Code == control.CodeLimit &&
					(strings.Contains(e.Message, "--max-sessions-per-uid") || strings.Contains(e.Message, "--max-sessions")):
					limited++
					c.Disconnect()
				default:
					t.Errorf("open: %v", err)
					c.Disconnect()
				}
			}()
		}
		wg.Wait()
		// The good session holds one slot of the uid's four.
		if opened != 3 || limited+opened+refusedAtConnect != 300 || refusedWithError == 0 {
			t.Errorf("opened %d, limited %d, refused at connect %d (%d with an ERROR); want 3 opened and the rest refused",
				opened, limited, refusedAtConnect, refusedWithError)
		}
		for _, c := range holders {
			c.Disconnect()
		}
	})
	waitFor(t, func() bool { return ts.srv.Status().Daemon.Sessions == 0 })
	time.Sleep(100 * time.Millisecond) // let the connect bucket refill a little
	if _, _, _, err := capture(t, ts, control.Open{Codec: "none", Policy: "block"}, size, 3, 100); err != nil {
		t.Fatalf("after the flood: %v", err)
	}
}

// dialErr dials like ts.dial but returns the error (a refusal arrives as *control.Error).
func dialErr(sock string) (*control.Client, error) {
	ctx, cancel := contextTimeout(5 * time.Second)
	defer cancel()
	return control.Dial(ctx, sock, "flood")
}

// TestRequestFlood: a connection sending control messages faster than --max-request-rate
// is cut off with a limit error; the other session is unaffected.
func TestRequestFlood(t *testing.T) {
	ts := startServer(t, Config{Clients: ClientLimits{RequestRate: 200}})
	alongside(t, ts, func(t *testing.T) {
		c := ts.dial(t)
		// The first replies are read, then the limit hits.
		var err error
		for i := 0; i < 1000 && err == nil; i++ {
			_, err = c.Status()
		}
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeLimit || !strings.Contains(e.Message, "--max-request-rate") {
			t.Fatalf("err = %v, want limit naming --max-request-rate", err)
		}
	})
}

// TestRequestFloodUnreadReplies: a client that floods requests without reading its
// replies, past the 256 queued replies that mute it and then over the request rate, still
// gets ERROR limit once it reads: the fatal error is never dropped with the replies.
func TestRequestFloodUnreadReplies(t *testing.T) {
	ts := startServer(t, Config{Clients: ClientLimits{RequestRate: 600}})
	c := ts.dial(t)
	req, _ := control.Encode(control.TypeStatus, nil)
	_ = c.Conn().Unix().SetWriteDeadline(time.Now().Add(5 * time.Second))
	sent := 0
	for range 2000 {
		if err := c.Conn().SendRaw(req); err != nil {
			break // strapd cut us off: the reason waits on the socket
		}
		sent++
	}
	_ = c.Conn().Unix().SetReadDeadline(time.Now().Add(10 * time.Second))
	replies := 0
	for {
		m, err := c.Recv()
		if err == nil {
			if m.Type == control.TypeStatusReply {
				replies++
			}
			continue
		}
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeLimit || !strings.Contains(e.Message, "--max-request-rate") {
			t.Fatalf("after %d requests and %d replies: %v, want ERROR limit naming --max-request-rate", sent, replies, err)
		}
		if replies >= sent {
			t.Fatalf("%d replies to %d requests: the flood was never muted", replies, sent)
		}
		return
	}
}

// TestNeverReadsReplies: a client that floods STATUS and never reads a reply does not
// stall the daemon; its replies are dropped once its queue is full and everyone else is
// served.
func TestNeverReadsReplies(t *testing.T) {
	ts := startServer(t, Config{})
	alongside(t, ts, func(t *testing.T) {
		c := ts.dial(t)
		rc, _ := c.Conn().Unix().SyscallConn()
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1024) })
		req, _ := control.Encode(control.TypeStatus, nil)
		_ = c.Conn().Unix().SetWriteDeadline(time.Now().Add(5 * time.Second))
		for range 2000 {
			if err := c.Conn().SendRaw(req); err != nil {
				break // the daemon may give up on us: fine
			}
		}
		// Another client is answered at once.
		sc := ts.dial(t)
		start := time.Now()
		if _, err := sc.Status(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("STATUS took %v while a client ignored its replies", d)
		}
	})
}

func contextTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// pipelineStream reads a stream file and returns its END status ("" before END).
func pipelineStream(path string) (string, error) {
	s, err := pipelinetest.ReadFile(path)
	if err != nil {
		return "", err
	}
	return s.EndStatus(), nil
}

// TestStatusPollDuringSessionEnds: clients polling STATUS while sessions end must not
// deadlock the daemon (Status takes the server lock, then each connection's; a finishing
// session once took them in the other order).
func TestStatusPollDuringSessionEnds(t *testing.T) {
	ts := startServer(t, Config{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := ts.dial(t)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if i%16 == 0 { // through the socket now and then, directly otherwise
					if _, err := sc.Status(); err != nil {
						t.Errorf("status: %v", err)
						return
					}
				} else {
					ts.srv.Status()
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			if _, _, _, err := capture(t, ts, control.Open{Codec: "none", Policy: "block"}, shm.HeaderSize+64<<10, 1, 16); err != nil {
				t.Errorf("capture %d: %v", i, err)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("sessions stopped finishing while STATUS was polled: deadlock")
	}
	close(stop)
	wg.Wait()
}

// TestOverwriteAfterPublish: a client that keeps rewriting payload bytes after PUBLISH
// (codec none: checked against the ring after their copy to an O_DIRECT staging buffer,
// or after a writev straight from the ring on a buffered file) never gets a stream that
// ends complete with a packet failing its CRC. Each run either ends complete with every
// packet verifying (the bytes changed before strapd read them, which no daemon can tell),
// or the client gets ERROR bad_record naming the overwrite and the stream ends with status
// error and verifies up to it. Whether a rewrite lands while strapd still reads a record
// is a race the test cannot steer (a fast disk path reads 1 MiB in well under a
// millisecond), so runs go on, up to maxRuns, until one has caught it.
func TestOverwriteAfterPublish(t *testing.T) {
	ts := startServer(t, Config{})
	const minRuns, maxRuns = 10, 80
	runs, detected := 0, 0
	for run := 0; run < maxRuns && (run < minRuns || detected == 0); run++ {
		runs++
		c := ts.dial(t)
		out := outFile(t)
		st, _, err := controltest.OpenStream(c, shm.HeaderSize+8<<20, out, control.Open{Codec: "none", Policy: "block"})
		if err != nil {
			t.Fatal(err)
		}
		mem := st.P.Mem()
		var (
			mu     sync.Mutex
			ranges [][2]uint64
		)
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for i := uint64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				if len(ranges) > 0 {
					r := ranges[int(i)%len(ranges)]
					mem[r[0]+(i*4099)%(r[1]-r[0])]++
				}
				mu.Unlock()
			}
		}()
		var firstErr error
		for i := range 6 {
			pos := st.P.Head()
			tn := tensor("model.layers.0.mlp", uint64(run*10+i+1), 1<<18) // 1 MiB
			if err := st.Put(&tn); err != nil {
				firstErr = err
				break
			}
			// The payload lies inside the record, past its header (name, shape, meta).
			from, to := shm.HeaderSize+pos%st.P.DataSize()+4096, shm.HeaderSize+st.P.Head()%st.P.DataSize()-4096
			mu.Lock()
			ranges = append(ranges, [2]uint64{from, to})
			mu.Unlock()
		}
		if firstErr == nil {
			// Finish by hand: the rewriting goes on until CLOSED, then the ring is unmapped.
			_, firstErr = c.Close(control.Close{Seq: st.P.LastSeq(), Head: st.P.Head(), Drops: st.Drops})
		}
		close(stop)
		<-done
		_ = st.P.Close()
		var status string
		waitFor(t, func() bool {
			status, err = pipelineStream(out.Name())
			return err == nil && status != ""
		})
		rep, err := stream.VerifyFile(out.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK {
			t.Fatalf("run %d: stream does not verify (END %q, client error %v): %+v", run, status, firstErr, rep)
		}
		if firstErr == nil {
			if status != "complete" {
				t.Fatalf("run %d: no error for the client, END %q", run, status)
			}
			continue
		}
		var e *control.Error
		if !errors.As(firstErr, &e) {
			// A send failed because strapd had already closed the connection: its ERROR
			// waits on the socket.
			_ = c.Conn().Unix().SetReadDeadline(time.Now().Add(10 * time.Second))
			_, firstErr = c.WaitRelease(1 << 60)
		}
		if !errors.As(firstErr, &e) || e.Code != control.CodeBadRecord || !strings.Contains(e.Message, "overwrote ring bytes after PUBLISH") {
			t.Fatalf("run %d: client error %v, want bad_record naming the overwrite", run, firstErr)
		}
		if status != "error" {
			t.Fatalf("run %d: client told %v, END %q", run, firstErr, status)
		}
		detected++
	}
	t.Logf("%d of %d runs caught the overwrite; every stream verified", detected, runs)
	if detected == 0 {
		t.Fatal("no run caught an overwrite made while strapd wrote the record")
	}
}

// TestOutputInUse: an OPEN whose output is the file a live session writes — reached through
// another descriptor of the same path or through a hard link, with no client lock taken — is
// refused with output_in_use naming the live session, and that session's stream is
// untouched; once it has ended, the file can be the output of a new session.
func TestOutputInUse(t *testing.T) {
	ts := startServer(t, Config{})
	size := uint64(shm.HeaderSize + 128<<10)
	c := ts.dial(t)
	out := outFile(t)
	st, opened, err := controltest.OpenStream(c, size, out, control.Open{Codec: "zstd", Policy: "block", BlockSize: 16 << 10,
		Metadata: map[string]any{"output_path": out.Name()}})
	if err != nil {
		t.Fatal(err)
	}
	var sent []shm.Tensor
	put := func(i int) {
		tn := tensor(fmt.Sprintf("model.layers.%d.mlp", i%4), uint64(i+1), 6000)
		if err := st.Put(&tn); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		sent = append(sent, tn)
	}
	for i := range 20 {
		put(i)
	}
	link := out.Name() + ".link"
	if err := os.Link(out.Name(), link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path string }{{"same path", out.Name()}, {"hard link", link}} {
		t.Run(tc.name, func(t *testing.T) {
			// What a careless client does: opens the path for writing, no flock, no O_TRUNC.
			f, err := os.OpenFile(tc.path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, _, err = controltest.OpenStream(ts.dial(t), size, f, control.Open{Codec: "none", Policy: "block",
				Metadata: map[string]any{"output_path": tc.path}})
			var e *control.Error
			want := fmt.Sprintf("live session %d (client pid %d", opened.Session, os.Getpid())
			if !errors.As(err, &e) || e.Code != control.CodeOutputInUse || !strings.Contains(e.Message, want) ||
				!strings.Contains(e.Message, tc.path) {
				t.Fatalf("err = %v, want output_in_use naming %q and %q", err, want, tc.path)
			}
		})
	}
	for i := 20; i < 40; i++ {
		put(i) // the live session goes on as if nothing happened
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	checkStream(t, out.Name(), sent, "complete")

	// Ended: the claim is gone, and the same file is a new session's output.
	f, err := os.OpenFile(link, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st2, _, err := controltest.OpenStream(ts.dial(t), size, f, control.Open{Codec: "none", Policy: "block"})
	if err != nil {
		t.Fatalf("open after the first session ended: %v", err)
	}
	tn := tensor("after", 99, 100)
	if err := st2.Put(&tn); err != nil {
		t.Fatal(err)
	}
	if _, err := st2.Finish(); err != nil {
		t.Fatal(err)
	}
	checkStream(t, link, []shm.Tensor{tn}, "complete")
}
