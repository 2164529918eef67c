package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// testServer runs a server on a socket in a short temp dir until the test ends.
type testServer struct {
	srv    *Server
	sock   string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "strapd-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.Socket = filepath.Join(dir, "run", "s.sock")
	if cfg.Version == "" {
		cfg.Version = "test"
	}
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	log := zap.NewNop()
	if _, bench := t.(*testing.B); !bench {
		log = zaptest.NewLogger(t)
	}
	srv := New(cfg, log)
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, sock: cfg.Socket, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

// stop cancels the server and returns Serve's result (once; later calls repeat it).
func (ts *testServer) stop(t testing.TB) error {
	ts.once.Do(func() {
		ts.cancel()
		select {
		case ts.err = <-ts.done:
		case <-time.After(20 * time.Second):
			ts.err = errors.New("server did not stop in 20s")
		}
		if ts.err != nil {
			t.Errorf("serve: %v", ts.err)
		}
	})
	return ts.err
}

func (ts *testServer) dial(t testing.TB) *control.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, ts.sock, "go-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect() })
	return c
}

func outFile(t testing.TB) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "out.strap"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func tensor(name string, seed uint64, n int) shm.Tensor {
	return shm.Tensor{Name: name, DType: dtype.Float32, Shape: []uint64{uint64(n)}, Step: seed,
		Payload: pipelinetest.Activations(seed, n)}
}

// capture streams count tensors of n floats through a new session and returns what was sent.
func capture(t *testing.T, ts *testServer, req control.Open, ringSize uint64, count, n int) (*os.File, []shm.Tensor, control.Closed, error) {
	c := ts.dial(t)
	out := outFile(t)
	st, _, err := controltest.OpenStream(c, ringSize, out, req)
	if err != nil {
		return out, nil, control.Closed{}, err
	}
	var sent []shm.Tensor
	for i := range count {
		tn := tensor(fmt.Sprintf("model.layers.%d.mlp", i%4), uint64(i+1), n)
		err := st.Put(&tn)
		if errors.Is(err, controltest.ErrDropped) {
			continue
		}
		if err != nil {
			return out, sent, control.Closed{}, err
		}
		sent = append(sent, tn)
	}
	cl, err := st.Finish()
	return out, sent, cl, err
}

func checkStream(t *testing.T, path string, sent []shm.Tensor, status string) *pipelinetest.Stream {
	t.Helper()
	st, err := pipelinetest.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.EndStatus() != status || !st.Footer {
		t.Fatalf("end %q (want %q), footer %v", st.EndStatus(), status, st.Footer)
	}
	got, err := st.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(sent) {
		t.Fatalf("%d tensors in stream, %d sent", len(got), len(sent))
	}
	for i := range sent {
		if got[i].Name != sent[i].Name || got[i].Step != sent[i].Step {
			t.Fatalf("tensor %d: %s step %d, want %s step %d", i, got[i].Name, got[i].Step, sent[i].Name, sent[i].Step)
		}
		if err := pipelinetest.Equal(got[i].Payload, sent[i].Payload); err != nil {
			t.Fatalf("tensor %d: %v", i, err)
		}
	}
	for i, p := range st.Packets {
		if p.Seq != uint64(i+1) {
			t.Fatalf("packet %d has seq %d", i, p.Seq)
		}
	}
	return st
}

func TestTwoSessionsExact(t *testing.T) {
	ts := startServer(t, Config{})
	var wg sync.WaitGroup
	for _, cd := range []string{"none", "zstd"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := control.Open{Codec: cd, Policy: "block", BlockSize: 64 << 10, Metadata: map[string]any{"model_class": "Test"}}
			out, sent, cl, err := capture(t, ts, req, shm.HeaderSize+256<<10, 40, 20000)
			if err != nil {
				t.Errorf("%s: %v", cd, err)
				return
			}
			st := checkStream(t, out.Name(), sent, "complete")
			// 80 KB tensors in a 256 KiB ring are sent as two parts each.
			if cl.Packets != uint64(len(st.Packets)) || cl.Packets != 80 || cl.Drops != 0 {
				t.Errorf("%s: closed %+v, %d packets in stream", cd, cl, len(st.Packets))
			}
			if cm, _ := st.Meta["client_metadata"].(map[string]any); cm["model_class"] != "Test" || st.Meta["codec"] != cd {
				t.Errorf("metadata %v", st.Meta)
			}
		}()
	}
	wg.Wait()
}

func TestDropPolicyWithSlowWriter(t *testing.T) {
	ts := startServer(t, Config{DebugWriteDelay: 3 * time.Millisecond})
	req := control.Open{Codec: "none", Policy: "drop"}
	out, sent, cl, err := capture(t, ts, req, shm.HeaderSize+64<<10, 60, 4000)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Drops == 0 {
		t.Fatal("expected drops with a tiny ring and a slow writer")
	}
	if cl.Packets != 60 || int(cl.Drops)+len(sent) != 60 || len(sent) == 0 {
		t.Fatalf("closed %+v, %d tensors kept", cl, len(sent))
	}
	st := checkStream(t, out.Name(), sent, "complete")
	drops := 0
	for _, p := range st.Packets {
		if p.Type == 2 {
			drops++
			if p.RawLen != 16000 || p.Meta["reason"] != "ring_full" {
				t.Fatalf("drop packet %+v", p)
			}
		}
	}
	if uint64(drops) != cl.Drops {
		t.Fatalf("%d DROP packets, CLOSED says %d", drops, cl.Drops)
	}
}

func TestBlockPolicyLosesNothing(t *testing.T) {
	ts := startServer(t, Config{DebugWriteDelay: time.Millisecond})
	req := control.Open{Codec: "lz4", Policy: "block", BlockSize: 16 << 10}
	// 64 KiB ring, tensors of 100 KB: every tensor is split into parts and the producer
	// waits for the slow writer constantly.
	out, sent, cl, err := capture(t, ts, req, shm.HeaderSize+64<<10, 20, 25000)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Drops != 0 || len(sent) != 20 {
		t.Fatalf("closed %+v", cl)
	}
	checkStream(t, out.Name(), sent, "complete")
}

func TestTornRecordIsolated(t *testing.T) {
	ts := startServer(t, Config{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		out, sent, _, err := capture(t, ts, control.Open{Codec: "zstd", Policy: "block"}, shm.HeaderSize+256<<10, 30, 10000)
		if err != nil {
			t.Errorf("good session: %v", err)
			return
		}
		checkStream(t, out.Name(), sent, "complete")
	}()

	c := ts.dial(t)
	out := outFile(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, out, control.Open{Codec: "none", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	a := tensor("a", 1, 100)
	if err := st.Put(&a); err != nil {
		t.Fatal(err)
	}
	// A record claiming seq 7 where 2 is due.
	b := tensor("b", 2, 100)
	pos := st.P.Head()
	if _, err := st.P.Put(&b); err != nil {
		t.Fatal(err)
	}
	st.P.Mem()[shm.HeaderSize+pos+8] = 7
	if err := c.Publish(st.P.Head(), 2); err != nil {
		t.Fatal(err)
	}
	_, err = c.WaitRelease(1 << 40)
	var e *control.Error
	if !errors.As(err, &e) || e.Code != control.CodeTornRecord || !strings.Contains(e.Message, "seq 7, expected 2") || !e.Fatal {
		t.Fatalf("err = %v, want fatal torn_record naming seq 7 and 2", err)
	}
	wg.Wait()
	waitFor(t, func() bool { return ts.srv.Status().Daemon.Sessions == 0 })
	s := checkStream(t, out.Name(), []shm.Tensor{a}, "error")
	if msg, _ := s.End.Meta["error"].(string); !strings.Contains(msg, "expected 2") {
		t.Fatalf("END error %q", msg)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not reached in 5s")
}

func TestOpenRefusals(t *testing.T) {
	ts := startServer(t, Config{MemoryLimit: 512 << 10, MaxRingSize: 512 << 10})
	// WELCOME tells the limit, so a client can fit its ring before OPEN.
	if got := ts.dial(t).Welcome().MaxRingSize; got != 512<<10 {
		t.Fatalf("WELCOME max_ring_size = %d, want %d", got, 512<<10)
	}
	sealed := func(t *testing.T, size uint64) *os.File {
		p, err := shm.NewProducer(size, shm.ProducerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p.File()
	}
	unsealed := func(t *testing.T) *os.File {
		p, err := shm.NewProducer(shm.HeaderSize+4096, shm.ProducerOptions{NoSeal: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p.File()
	}
	regular := func(t *testing.T) *os.File {
		f := outFile(t)
		if err := f.Truncate(shm.HeaderSize + 4096); err != nil {
			t.Fatal(err)
		}
		return f
	}
	readOnly := func(t testing.TB) *os.File {
		f, err := os.Open(outFile(t).Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	pipe := func(t testing.TB) *os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		return w
	}
	appendOut := func(t testing.TB) *os.File {
		f, err := os.OpenFile(filepath.Join(t.TempDir(), "a"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	small := uint64(shm.HeaderSize + 4096)
	tests := []struct {
		name     string
		ring     func(t *testing.T) *os.File
		out      func(t testing.TB) *os.File
		req      control.Open
		wantCode string
		wantSub  string
	}{
		{"unsealed memfd", unsealed, outFile, control.Open{RingSize: small, Codec: "none", Policy: "block"}, control.CodeRingNotSealed, "F_SEAL_SHRINK"},
		{"ring is a regular file", regular, outFile, control.Open{RingSize: small, Codec: "none", Policy: "block"}, control.CodeRingNotSealed, "memfd"},
		{"ring size lies", func(t *testing.T) *os.File { return sealed(t, small) }, outFile, control.Open{RingSize: small + 4096, Codec: "none", Policy: "block"}, control.CodeRingSize, "OPEN declared ring_size"},
		{"output read-only", func(t *testing.T) *os.File { return sealed(t, small) }, readOnly, control.Open{RingSize: small, Codec: "none", Policy: "block"}, control.CodeBadOutput, "not open for writing"},
		{"output is a pipe", func(t *testing.T) *os.File { return sealed(t, small) }, pipe, control.Open{RingSize: small, Codec: "none", Policy: "block"}, control.CodeBadOutput, "regular file"},
		{"output O_APPEND", func(t *testing.T) *os.File { return sealed(t, small) }, appendOut, control.Open{RingSize: small, Codec: "none", Policy: "block"}, control.CodeBadOutput, "O_APPEND"},
		{"unknown codec", func(t *testing.T) *os.File { return sealed(t, small) }, outFile, control.Open{RingSize: small, Codec: "brotli", Policy: "block"}, control.CodeBadCodec, "brotli"},
		{"lossy codec without bound", func(t *testing.T) *os.File { return sealed(t, small) }, outFile, control.Open{RingSize: small, Codec: "quant", Policy: "block"}, control.CodeBadCodec, "needs a bound"},
		{"lossless codec with bound", func(t *testing.T) *os.File { return sealed(t, small) }, outFile, control.Open{RingSize: small, Codec: "zstd", Policy: "block", Lossy: &control.Lossy{Mode: "rel", Value: 1e-3}}, control.CodeBadCodec, "lossy"},
		{"bad policy", func(t *testing.T) *os.File { return sealed(t, small) }, outFile, control.Open{RingSize: small, Codec: "none", Policy: "maybe"}, control.CodeBadMessage, "policy"},
		{"ring over limit", func(t *testing.T) *os.File { return sealed(t, small) }, outFile, control.Open{RingSize: 1 << 20, Codec: "none", Policy: "block"}, control.CodeLimit, "--max-ring-size"},
		{"memory budget", func(t *testing.T) *os.File { return sealed(t, shm.HeaderSize+300<<10) }, outFile, control.Open{RingSize: shm.HeaderSize + 300<<10, Codec: "zstd", Policy: "block"}, control.CodeMemoryBudget, "memory budget"},
		{"bad ring size", func(t *testing.T) *os.File { return sealed(t, small) }, outFile, control.Open{RingSize: small + 10, Codec: "none", Policy: "block"}, control.CodeRingSize, "multiple of 64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ts.dial(t)
			_, err := c.Open(tc.ring(t), tc.out(t), tc.req)
			var e *control.Error
			if !errors.As(err, &e) || e.Code != tc.wantCode || !strings.Contains(e.Message, tc.wantSub) {
				t.Fatalf("err = %v, want code %s containing %q", err, tc.wantCode, tc.wantSub)
			}
		})
	}
	t.Run("one fd", func(t *testing.T) {
		c := ts.dial(t)
		if err := c.Conn().Send(control.TypeOpen, control.Open{RingSize: small, Codec: "none", Policy: "block"}, int(sealed(t, small).Fd())); err != nil {
			t.Fatal(err)
		}
		_, err := c.WaitRelease(1 << 40)
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeBadMessage || !strings.Contains(e.Message, "expected 2") {
			t.Fatalf("err = %v", err)
		}
	})
	if st := ts.srv.Status(); st.Daemon.Sessions != 0 || st.Daemon.MemoryUsed != idleStagingBytes(ts.srv) {
		t.Fatalf("refused opens left state behind: %+v", st.Daemon)
	}
}

func TestClientDeathMidCapture(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	out := outFile(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+256<<10, out, control.Open{Codec: "lz4", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	var sent []shm.Tensor
	for i := range 10 {
		tn := tensor("m", uint64(i+1), 5000)
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, tn)
	}
	// A record written but never published must not appear.
	unpub := tensor("unpublished", 99, 10)
	if _, err := st.P.Put(&unpub); err != nil {
		t.Fatal(err)
	}
	c.Disconnect()
	waitFor(t, func() bool { return ts.srv.Status().Daemon.Sessions == 0 })
	s := checkStream(t, out.Name(), sent, "aborted")
	if s.End.Meta["packets"] != float64(10) {
		t.Fatalf("END %v", s.End.Meta)
	}
}

func TestProtocolVersionMismatch(t *testing.T) {
	ts := startServer(t, Config{})
	conn, err := control.DialConn(context.Background(), ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, _ := control.EncodeRaw(2, control.TypeHello, []byte(`{"protocol":2,"client":"future"}`))
	if err := conn.SendRaw(raw); err != nil {
		t.Fatal(err)
	}
	m, _, err := conn.Recv(0)
	if err != nil {
		t.Fatal(err)
	}
	var e control.Error
	if m.Type != control.TypeError || m.Version != 1 || m.Unmarshal(&e) != nil || e.Code != control.CodeProtocolVersion ||
		e.Message != "client speaks protocol 2, strapd speaks protocol 1" {
		t.Fatalf("got %s %+v", m.Type, e)
	}
	if _, _, err := conn.Recv(0); err == nil {
		t.Fatal("connection stays open after a version mismatch")
	}
}

func TestBadMessages(t *testing.T) {
	ts := startServer(t, Config{})
	tests := []struct {
		name    string
		send    func(c *control.Client) error
		wantSub string
	}{
		{"not json", func(c *control.Client) error {
			raw, _ := control.EncodeRaw(1, control.TypeStatus, []byte("nope"))
			return c.Conn().SendRaw(raw)
		}, "not valid JSON"},
		{"publish before open", func(c *control.Client) error { return c.Publish(64, 1) }, "PUBLISH before OPEN"},
		{"unknown type", func(c *control.Client) error {
			raw, _ := control.EncodeRaw(1, 99, []byte("{}"))
			return c.Conn().SendRaw(raw)
		}, "unexpected type(99)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ts.dial(t)
			if err := tc.send(c); err != nil {
				t.Fatal(err)
			}
			_, err := c.WaitRelease(1 << 40)
			var e *control.Error
			if !errors.As(err, &e) || e.Code != control.CodeBadMessage || !strings.Contains(e.Message, tc.wantSub) {
				t.Fatalf("err = %v, want bad_message containing %q", err, tc.wantSub)
			}
		})
	}
}

func TestStatus(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	out := outFile(t)
	st, o, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, out, control.Open{Codec: "none", Policy: "block",
		Metadata: map[string]any{"model_class": "Llama", "output_path": "/x/y.strap"}})
	if err != nil {
		t.Fatal(err)
	}
	a := tensor("a", 1, 100)
	if err := st.Put(&a); err != nil {
		t.Fatal(err)
	}
	sc := ts.dial(t)
	var rep control.StatusReply
	waitFor(t, func() bool {
		rep, err = sc.Status()
		return err == nil && len(rep.Sessions) == 1 && rep.Sessions[0].Packets == 1
	})
	s := rep.Sessions[0]
	if s.Session != o.Session || s.ModelClass != "Llama" || s.OutputPath != "/x/y.strap" || int(s.PID) != os.Getpid() ||
		s.BytesIn != 400 || s.RingSize != shm.HeaderSize+64<<10 || rep.Daemon.Sessions != 1 || rep.Daemon.MemoryUsed == 0 {
		t.Fatalf("status %+v", rep)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestShutdownDrains(t *testing.T) {
	ts := startServer(t, Config{DebugWriteDelay: 2 * time.Millisecond})
	c := ts.dial(t)
	out := outFile(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+256<<10, out, control.Open{Codec: "zstd", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	var sent []shm.Tensor
	for i := range 20 {
		tn := tensor("m", uint64(i+1), 2000)
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, tn)
	}
	if err := ts.stop(t); err != nil {
		t.Fatal(err)
	}
	_, err = c.WaitRelease(1 << 40)
	var e *control.Error
	if !errors.As(err, &e) || e.Code != control.CodeShutdown {
		t.Fatalf("client got %v, want ERROR shutdown", err)
	}
	checkStream(t, out.Name(), sent, "aborted")
	if _, err := os.Stat(ts.sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}

func TestListen(t *testing.T) {
	t.Run("refuses when another daemon answers", func(t *testing.T) {
		ts := startServer(t, Config{})
		err := New(Config{Socket: ts.sock}, nil).Listen()
		if !errors.Is(err, ErrAlreadyRunning) {
			t.Fatalf("err = %v", err)
		}
		live, ok := errors.AsType[*AlreadyRunningError](err)
		if !ok || live.Socket != ts.sock || live.PID != os.Getpid() {
			t.Fatalf("err = %#v, want the socket and this process's pid", err)
		}
	})
	t.Run("daemons started at once: one listens, the others find it", func(t *testing.T) {
		for round := range 20 {
			dir, err := os.MkdirTemp("", "strapd-test")
			if err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(dir, "sub", "s.sock")
			if round%2 == 1 { // a stale socket left by a dead daemon, taken over by one of them
				os.Mkdir(filepath.Dir(sock), 0o700)
				ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
				if err != nil {
					t.Fatal(err)
				}
				ln.SetUnlinkOnClose(false)
				ln.Close()
			}
			const n = 8
			servers := make([]*Server, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				servers[i] = New(Config{Socket: sock}, nil)
				wg.Go(func() { errs[i] = servers[i].Listen() })
			}
			wg.Wait()
			var listening []*Server
			for i, err := range errs {
				if err == nil {
					listening = append(listening, servers[i])
					continue
				}
				if live, ok := errors.AsType[*AlreadyRunningError](err); !ok || live.PID != os.Getpid() {
					t.Errorf("round %d: server %d: %v, want AlreadyRunningError naming this process", round, i, err)
				}
			}
			if len(listening) != 1 {
				t.Fatalf("round %d: %d servers listening, want 1", round, len(listening))
			}
			c, err := net.Dial("unixpacket", sock)
			if err != nil {
				t.Fatalf("round %d: the listening server does not answer: %v", round, err)
			}
			c.Close()
			listening[0].ln.Close()
			os.RemoveAll(dir)
		}
	})
	t.Run("removes a stale socket", func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "strapd-test")
		defer os.RemoveAll(dir)
		sock := filepath.Join(dir, "s.sock")
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
		s := New(Config{Socket: sock}, nil)
		if err := s.Listen(); err != nil {
			t.Fatalf("stale socket not replaced: %v", err)
		}
		s.ln.Close()
	})
	t.Run("a stopping daemon removes its own socket", func(t *testing.T) {
		ts := startServer(t, Config{})
		if err := ts.stop(t); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(ts.sock); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket left behind: %v", err)
		}
	})
	t.Run("a stopping daemon leaves its successor's socket", func(t *testing.T) {
		// A daemon exiting idle while a client autostarts another: the new one took the
		// path over (removed and bound it) before the old one closed.
		ts := startServer(t, Config{})
		if err := os.Remove(ts.sock); err != nil {
			t.Fatal(err)
		}
		next := New(Config{Socket: ts.sock}, nil)
		if err := next.Listen(); err != nil {
			t.Fatal(err)
		}
		defer next.ln.Close()
		if err := ts.stop(t); err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("unixpacket", ts.sock)
		if err != nil {
			t.Fatalf("the successor's socket is gone after the old daemon stopped: %v", err)
		}
		c.Close()
	})
	t.Run("refuses a non-socket path", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, "file")
		os.WriteFile(p, nil, 0o600)
		if err := New(Config{Socket: p}, nil).Listen(); !errors.Is(err, ErrNotSocket) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("parent dir 0700", func(t *testing.T) {
		ts := startServer(t, Config{})
		fi, err := os.Stat(filepath.Dir(ts.sock))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("dir mode %v %v", fi.Mode(), err)
		}
	})
}

// TestSilentClient: a client that publishes but never reads its replies must not stall
// the daemon; a second connection is served meanwhile.
func TestSilentClient(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	out := outFile(t)
	p, err := shm.NewProducer(shm.HeaderSize+1<<20, shm.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := c.Open(p.File(), out, control.Open{RingSize: shm.HeaderSize + 1<<20, Codec: "none", Policy: "block"}); err != nil {
		t.Fatal(err)
	}
	// Shrink our receive buffer so replies pile up quickly.
	rc, _ := c.Conn().Unix().SyscallConn()
	rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1024) })
	tn := shm.Tensor{Name: "x", DType: dtype.Uint8, Shape: []uint64{1}, Payload: []byte{1}}
	for range 5000 {
		if !p.Fits(&tn) {
			// Nothing read: assume everything published was released (the daemon writes fast).
			waitFor(t, func() bool { return ts.srv.Status().Sessions[0].RingUsed == 0 })
			p.Release(p.Head())
		}
		seq, err := p.Put(&tn)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Publish(p.Head(), seq); err != nil {
			t.Fatal(err)
		}
	}
	sc := ts.dial(t)
	waitFor(t, func() bool {
		rep, err := sc.Status()
		return err == nil && len(rep.Sessions) == 1 && rep.Sessions[0].Packets == 5000
	})
}

// TestExitIdle: with ExitIdle set, Serve keeps running while a client is connected however
// long it stays, and returns cleanly once no client has been connected for ExitIdle.
func TestExitIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	ts := startServer(t, Config{ExitIdle: idle})
	c := ts.dial(t)
	select {
	case err := <-ts.done:
		t.Fatalf("Serve returned %v while a client was connected", err)
	case <-time.After(3 * idle):
	}
	if _, err := c.Status(); err != nil {
		t.Fatalf("status after %v connected: %v", 3*idle, err)
	}
	closed := time.Now()
	c.Disconnect()
	select {
	case err := <-ts.done:
		if err != nil {
			t.Fatalf("Serve after idle: %v", err)
		}
		if waited := time.Since(closed); waited < idle {
			t.Fatalf("exited %v after the last client left, before the idle time %v", waited, idle)
		}
		ts.once.Do(func() {}) // Serve already returned: nothing left for stop to cancel
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still running 10s after the last client left")
	}
}

// idleStagingBytes is the memory budget's count for the O_DIRECT staging buffers that
// ended sessions left for the next one (held in the budget with no session open).
func idleStagingBytes(s *Server) int64 {
	return int64(s.budget.IdleStaging()) * stream.StagingBufSize
}

// TestStatusRank: a session opened with metadata.distributed carries its rank, world size,
// local rank, host and job id in STATUS (what `strapd status --json` prints and the metrics
// label); a single process's has none; a distributed object that is not what the client
// documents refuses the OPEN, naming what is wrong.
func TestStatusRank(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	dist := map[string]any{"rank": 1, "world_size": 2, "local_rank": 1, "local_world_size": 2, "host": "node07",
		"source": "env", "job_id": "run-7"}
	st, o, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, outFile(t), control.Open{Codec: "none", Policy: "block",
		Metadata: map[string]any{"output_path": "/x/cap.rank00001-of-00002.strap", "distributed": dist}})
	if err != nil {
		t.Fatal(err)
	}
	single, o2, err := controltest.OpenStream(ts.dial(t), shm.HeaderSize+64<<10, outFile(t), control.Open{Codec: "none",
		Policy: "block", Metadata: map[string]any{"output_path": "/x/one.strap"}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ts.dial(t).Status()
	if err != nil || len(rep.Sessions) != 2 {
		t.Fatalf("status %+v %v", rep, err)
	}
	for _, s := range rep.Sessions {
		switch s.Session {
		case o.Session:
			d := s.Distributed
			if d == nil || d.Rank != 1 || d.WorldSize != 2 || d.LocalRank == nil || *d.LocalRank != 1 || d.Host != "node07" || d.JobID != "run-7" {
				t.Errorf("ranked session's distributed: %+v", d)
			}
		case o2.Session:
			if s.Distributed != nil {
				t.Errorf("single process with distributed %+v", s.Distributed)
			}
			b, _ := json.Marshal(s)
			if strings.Contains(string(b), `"distributed"`) {
				t.Errorf("single process's status names distributed: %s", b)
			}
		}
	}
	for _, s := range []*controltest.Stream{st, single} {
		if _, err := s.Finish(); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name string
		dist any
		want string
	}{
		{"rank outside the world", map[string]any{"rank": 2, "world_size": 2}, "rank 2 is not below world_size 2"},
		{"no world size", map[string]any{"rank": 0}, "rank and world_size are required"},
		{"negative rank", map[string]any{"rank": -1, "world_size": 2}, "non-negative integers"},
		{"fractional rank", map[string]any{"rank": 0.5, "world_size": 2}, "non-negative integers"},
		{"rank as text", map[string]any{"rank": "0", "world_size": 2}, "non-negative integers"},
		{"host not text", map[string]any{"rank": 0, "world_size": 2, "host": 7}, "host and job_id strings"},
		{"host too long", map[string]any{"rank": 0, "world_size": 2, "host": strings.Repeat("h", 256)}, "host is not UTF-8 text of at most 255 bytes"},
		{"not an object", []int{1, 2}, "OPEN metadata.distributed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := controltest.OpenStream(ts.dial(t), shm.HeaderSize+64<<10, outFile(t), control.Open{Codec: "none",
				Policy: "block", Metadata: map[string]any{"distributed": tc.dist}})
			var pe *control.Error
			if !errors.As(err, &pe) || pe.Code != control.CodeBadMessage || !strings.Contains(pe.Message, tc.want) {
				t.Fatalf("OPEN: %v, want bad_message saying %q", err, tc.want)
			}
		})
	}
}
