package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

// fuzzHang is how long one fuzz input may take before it counts as a hang.
const fuzzHang = 5 * time.Second

// hung reports a hung input and crashes the fuzz worker, so the fuzzer keeps the input.
// A worker's stderr goes nowhere, so the goroutine dump is written to
// $TMPDIR/strapd-fuzz-hang-PID.txt first.
func hung(msg string) {
	if f, err := os.Create(filepath.Join(os.TempDir(), fmt.Sprintf("strapd-fuzz-hang-%d.txt", os.Getpid()))); err == nil {
		fmt.Fprintln(f, msg)
		_ = pprof.Lookup("goroutine").WriteTo(f, 2)
		f.Close()
	}
	panic(msg)
}

// fuzzServer starts a server for a fuzz target, with every rate and connection limit off
// (a fuzzer connects thousands of times a second) and no logging.
func fuzzServer(f *testing.F) *testServer {
	f.Helper()
	dir, err := os.MkdirTemp("", "strapd-fuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	cfg := Config{Socket: filepath.Join(dir, "s.sock"), Workers: 1, MemoryLimit: 64 << 20, HandshakeTimeout: time.Second,
		Clients: ClientLimits{MaxConns: -1, MaxConnsPerUID: -1, MaxSessionsPerUID: -1, ConnectRate: -1, RequestRate: -1}}
	srv := New(cfg, nil)
	if err := srv.Listen(); err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, sock: cfg.Socket, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx) }()
	f.Cleanup(func() { ts.stop(f) })
	return ts
}

func fuzzDial(t *testing.T, sock string) *control.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, sock, "fuzz")
	if err != nil {
		t.Fatalf("daemon stopped answering: %v", err)
	}
	return c
}

// fuzzIdle waits until the server holds no session (the previous input is finished).
// fuzzSession opens a session whose ring's data region starts with data (the fuzz
// input), writing to dir/out.strap; the ring and the output file are closed when the test
// ends, the connection by the caller.
// fuzzRingSize is the ring of the fuzzed sessions: small, so inputs fill it.
const fuzzRingSize = shm.HeaderSize + 8<<10

func fuzzSession(t *testing.T, ts *testServer, dir string, data []byte) (*shm.Producer, *control.Client, string) {
	p, err := shm.NewProducer(fuzzRingSize, shm.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	copy(p.Mem()[shm.HeaderSize:], data)
	outPath := filepath.Join(dir, "out.strap")
	out, err := os.OpenFile(outPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	c := fuzzDial(t, ts.sock)
	if _, err := c.Open(p.File(), out, control.Open{RingSize: fuzzRingSize, Codec: "lz4", Policy: "block", BlockSize: 4096}); err != nil {
		c.Disconnect()
		t.Fatalf("open: %v", err)
	}
	return p, c, outPath
}

func fuzzIdle(t *testing.T, ts *testServer) {
	t.Helper()
	for range 1000 {
		if ts.srv.Status().Daemon.Sessions == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("a session did not end in 5s")
}

// FuzzControlMessages sends arbitrary datagrams (the input split by u16 length prefixes)
// on a connection after HELLO. Whatever they hold, the daemon must answer the connection
// or close it, keep serving others, and leave no session behind.
func FuzzControlMessages(f *testing.F) {
	ts := fuzzServer(f)
	frame := func(msgs ...[]byte) []byte {
		var b []byte
		for _, m := range msgs {
			b = binary.LittleEndian.AppendUint16(b, uint16(len(m)))
			b = append(b, m...)
		}
		return b
	}
	enc := func(t control.Type, body string) []byte {
		b, _ := control.EncodeRaw(control.Version, t, []byte(body))
		return b
	}
	f.Add(frame(enc(control.TypeStatus, "{}")))
	f.Add(frame(enc(control.TypeStatus, "{}"), enc(control.TypeStatus, "{}")))
	f.Add(frame(enc(control.TypePublish, `{"head":64,"seq":1}`)))
	f.Add(frame(enc(control.TypeOpen, `{"ring_size":4160,"codec":"none","policy":"block"}`)))
	f.Add(frame(enc(control.TypeClose, `{"seq":0,"head":0,"drops":0}`)))
	f.Add(frame([]byte("STRP\x02\x00\x01\x00\x02\x00\x00\x00{}")))
	f.Add(frame([]byte("garbage")))
	// The protocol's golden messages (testdata/protocol), one by one and all in a row.
	golden, _ := filepath.Glob("../../testdata/protocol/*.bin")
	var all [][]byte
	for _, p := range golden {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame(b))
		all = append(all, b)
	}
	f.Add(frame(all...))
	f.Fuzz(func(t *testing.T, in []byte) {
		defer time.AfterFunc(fuzzHang, func() { hung(fmt.Sprintf("input hung: %q", in)) }).Stop()
		c := fuzzDial(t, ts.sock)
		defer c.Disconnect()
		for len(in) >= 2 {
			n := int(binary.LittleEndian.Uint16(in))
			in = in[2:]
			n = min(n, len(in))
			if err := c.Conn().SendRaw(in[:n]); err != nil {
				break // the daemon closed the connection: allowed
			}
			in = in[n:]
		}
		// Read until the daemon closes or stays quiet; it must not hang the client forever.
		_ = c.Conn().Unix().SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		for {
			if _, _, err := c.Conn().Recv(2); err != nil {
				break
			}
		}
		c.Disconnect()
		sc := fuzzDial(t, ts.sock)
		defer sc.Disconnect()
		if _, err := sc.Status(); err != nil {
			t.Fatalf("STATUS after the input: %v", err)
		}
		fuzzIdle(t, ts)
	})
}

// FuzzSessionRecords writes arbitrary bytes into a sealed ring's data region and
// publishes an arbitrary head and seq, then closes. Whatever the bytes, the daemon must
// answer (CLOSED or a fatal ERROR) and the output must be a valid stream: header, packets
// with good CRCs, END (complete or error), index and footer.
func FuzzSessionRecords(f *testing.F) {
	ts := fuzzServer(f)
	const ringSize = fuzzRingSize
	// A valid window of two records, then the same with a lying seq.
	good := func() ([]byte, uint64, uint64) {
		p, err := shm.NewProducer(ringSize, shm.ProducerOptions{})
		if err != nil {
			f.Fatal(err)
		}
		defer p.Close()
		for i := range 2 {
			tn := tensor("model.layers.0.mlp", uint64(i+1), 200)
			if _, err := p.Put(&tn); err != nil {
				f.Fatal(err)
			}
		}
		return append([]byte(nil), p.Mem()[shm.HeaderSize:shm.HeaderSize+p.Head()]...), p.Head(), p.LastSeq()
	}
	b, head, seq := good()
	f.Add(b, head, seq)
	f.Add(b, head, seq+1)
	// Records and TOKEN records (ring tokens, PROTOCOL.md 2) in one window.
	{
		p, err := shm.NewProducer(ringSize, shm.ProducerOptions{})
		if err != nil {
			f.Fatal(err)
		}
		tn := tensor("model.layers.0.mlp", 1, 200)
		if _, err := p.Put(&tn); err != nil {
			f.Fatal(err)
		}
		if _, err := p.PutToken(0, 42, 7, "tok"); err != nil {
			f.Fatal(err)
		}
		if _, err := p.Put(&tn); err != nil {
			f.Fatal(err)
		}
		if _, err := p.PutToken(1, -1, 8, "\u00e9"); err != nil {
			f.Fatal(err)
		}
		f.Add(append([]byte(nil), p.Mem()[shm.HeaderSize:shm.HeaderSize+p.Head()]...), p.Head(), p.LastSeq())
		p.Close()
	}
	f.Add(b, head-64, seq)
	f.Add([]byte{}, uint64(0), uint64(0))
	f.Add([]byte("SREC"), uint64(64), uint64(1))
	// The ring's golden records (testdata/ring), each published alone with its own seq.
	records, _ := filepath.Glob("../../testdata/ring/record_*.bin")
	tokens, _ := filepath.Glob("../../testdata/ring/token_*.bin")
	records = append(records, tokens...)
	for _, p := range records {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) >= 16 {
			f.Add(b, uint64(len(b)), binary.LittleEndian.Uint64(b[8:]))
		}
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, head, seq uint64) {
		// A hang is a bug too: crash so the fuzzer keeps the input.
		defer time.AfterFunc(fuzzHang, func() {
			hung(fmt.Sprintf("input hung: %d data bytes, head %d, seq %d", len(data), head, seq))
		}).Stop()
		_, c, outPath := fuzzSession(t, ts, dir, data)
		defer c.Disconnect()
		_ = c.Conn().Unix().SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.Publish(head, seq); err != nil {
			t.Fatalf("publish: %v", err)
		}
		_, closeErr := c.Close(control.Close{Seq: seq, Head: head})
		if errors.Is(closeErr, os.ErrDeadlineExceeded) || errors.Is(closeErr, unix.EAGAIN) {
			t.Fatalf("daemon did not answer CLOSE in 10s")
		}
		// Otherwise CLOSED, the ERROR, or EOF/EPIPE when the daemon closed the connection
		// right after its ERROR.
		c.Disconnect()
		fuzzIdle(t, ts)
		s, err := pipelinetest.ReadFile(outPath)
		if err != nil {
			t.Fatalf("output is not a valid stream: %v", err)
		}
		if st := s.EndStatus(); (st != "complete" && st != "error") || !s.Footer {
			t.Fatalf("END %q footer %v", st, s.Footer)
		}
		if closeErr == nil && s.EndStatus() != "complete" {
			t.Fatalf("CLOSED but END %q", s.EndStatus())
		}
	})
}

// FuzzPublishedCursor: a client dies leaving any ring bytes and any published cursor
// (PROTOCOL.md 1.4, "Client death"). The daemon takes what it can below the cursor and
// ends the stream aborted, with every packet before the first bad record verifying.
func FuzzPublishedCursor(f *testing.F) {
	ts := fuzzServer(f)
	const ringSize = fuzzRingSize
	p, err := shm.NewProducer(ringSize, shm.ProducerOptions{})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 3 {
		tn := tensor("model.layers.0.mlp", uint64(i+1), 200)
		if _, err := p.Put(&tn); err != nil {
			f.Fatal(err)
		}
	}
	good, head := append([]byte(nil), p.Mem()[shm.HeaderSize:shm.HeaderSize+p.Head()]...), p.Head()
	p.Close()
	f.Add(good, head)
	f.Add(good, head-64)
	f.Add(good, head+64)
	f.Add(good, uint64(ringSize))
	f.Add(good, ^uint64(0))
	f.Add([]byte{}, uint64(0))
	f.Add([]byte("SREC"), uint64(64))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, cursor uint64) {
		defer time.AfterFunc(fuzzHang, func() {
			hung(fmt.Sprintf("input hung: %d data bytes, cursor %d", len(data), cursor))
		}).Stop()
		p, c, outPath := fuzzSession(t, ts, dir, data)
		p.SetPublished(cursor)
		c.Disconnect()
		fuzzIdle(t, ts)
		s, err := pipelinetest.ReadFile(outPath)
		if err != nil {
			t.Fatalf("output is not a valid stream: %v", err)
		}
		if st := s.EndStatus(); st != "aborted" || !s.Footer {
			t.Fatalf("END %q footer %v", st, s.Footer)
		}
	})
}
