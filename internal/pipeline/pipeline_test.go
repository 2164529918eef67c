package pipeline

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// harness drives one session in-process: a Go producer writes the ring, the test calls
// Publish directly, and RELEASE tails come back through a channel.
type harness struct {
	tb      testing.TB
	p       *shm.Producer
	s       *Session
	out     *os.File
	tail    atomic.Uint64
	rel     chan struct{}
	errs    chan error
	pubHead uint64
	lastSeq uint64
	drops   uint64
}

type hopts struct {
	codec      string
	lossy      *codec.LossyBound
	ringSize   uint64
	blockSize  int
	budget     *Budget
	pool       *Pool
	writeDelay time.Duration
	output     *os.File
	// memoryHint is the request's memory_hint (0: none).
	memoryHint uint64
	// cpu is the daemon's CPU budget (nil: unlimited).
	cpu *CPUBudget
	// durableEvery and onDurable are Env's (uploads).
	durableEvery uint64
	onDurable    func(uint64)
}

func newHarness(tb testing.TB, o hopts) *harness {
	tb.Helper()
	if o.ringSize == 0 {
		o.ringSize = shm.HeaderSize + 1<<20
	}
	if o.budget == nil {
		o.budget = NewBudget(0)
	}
	if o.pool == nil {
		o.pool = NewPool(2, o.cpu != nil)
		tb.Cleanup(o.pool.Close)
	}
	p, err := shm.NewProducer(o.ringSize, shm.ProducerOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	out := o.output
	if out == nil {
		out, err = os.Create(filepath.Join(tb.TempDir(), "out.strap"))
		if err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() { out.Close() })
	name := o.codec
	if name == "" {
		name = "none"
	}
	plan, err := Prepare(Request{RingSize: o.ringSize, Codec: name, Lossy: o.lossy, BlockSize: uint64(o.blockSize),
		Policy: "block", MemoryHint: o.memoryHint, ClientMetadata: map[string]any{"test": true}})
	if err != nil {
		tb.Fatal(err)
	}
	// Open takes the descriptor it maps; the producer keeps its own.
	fd, err := unix.Dup(int(p.File().Fd()))
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{tb: tb, p: p, out: out, rel: make(chan struct{}, 1), errs: make(chan error, 1)}
	h.s, err = plan.Open(Env{ID: 1, Pool: o.pool, Budget: o.budget, CPU: o.cpu, WriteDelay: o.writeDelay,
		Release: func(t uint64) {
			h.tail.Store(t)
			select {
			case h.rel <- struct{}{}:
			default:
			}
		},
		OnError:   func(e error) { h.errs <- e },
		OnDurable: o.onDurable, DurableEvery: o.durableEvery,
	}, fd, out)
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

func (h *harness) publish() error {
	if h.pubHead == h.p.Head() {
		return nil
	}
	h.pubHead = h.p.Head()
	return h.s.Publish(h.p.Head(), h.lastSeq)
}

// put places t (split into parts as needed), waiting for releases (policy block).
func (h *harness) put(t *shm.Tensor) error {
	for _, part := range h.p.Split(t) {
		for !h.p.Fits(&part) {
			if err := h.publish(); err != nil {
				return err
			}
			select {
			case <-h.rel:
			case <-h.s.Failed():
				return h.s.Err()
			case <-time.After(10 * time.Second):
				h.tb.Fatal("no release within 10s")
			}
			if err := h.p.Release(h.tail.Load()); err != nil {
				h.tb.Fatal(err)
			}
		}
		seq, err := h.p.Put(&part)
		if err != nil {
			h.tb.Fatal(err)
		}
		h.lastSeq = seq
	}
	return h.publish()
}

func (h *harness) finish(status string) (Result, error) {
	if status == StatusComplete {
		if err := h.s.CheckClose(Close{Seq: h.p.LastSeq(), Head: h.p.Head(), Drops: h.drops}); err != nil {
			h.s.Finish(status)
			return Result{}, err
		}
	}
	return h.s.Finish(status)
}

func f32Tensor(name string, seed uint64, shape ...uint64) shm.Tensor {
	n := uint64(1)
	for _, d := range shape {
		n *= d
	}
	return shm.Tensor{Name: name, DType: dtype.Float32, Shape: shape, Step: seed, Forward: seed / 2,
		Payload: pipelinetest.Activations(seed, int(n))}
}

func TestSessionExact(t *testing.T) {
	tests := []struct {
		name      string
		codec     string
		ringSize  uint64
		blockSize int
	}{
		{"none", "", shm.HeaderSize + 256<<10, 0},
		{"none explicit", "none", shm.HeaderSize + 256<<10, 0},
		{"lz4", "lz4", shm.HeaderSize + 256<<10, 16 << 10},
		{"zstd", "zstd", shm.HeaderSize + 256<<10, 16 << 10},
		{"zstd one block", "zstd", shm.HeaderSize + 1<<20, 0},
		{"shuffle", "shuffle", shm.HeaderSize + 256<<10, 16 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hopts{codec: tc.codec, ringSize: tc.ringSize, blockSize: tc.blockSize})
			var want []shm.Tensor
			for i := range 12 {
				// Sizes from tiny to larger than the ring (split into parts).
				n := uint64(3 << (i % 7 * 2))
				tn := f32Tensor("model.layers."+string(rune('0'+i%10))+".mlp", uint64(i+1), n, 7)
				want = append(want, tn)
				if err := h.put(&tn); err != nil {
					t.Fatal(err)
				}
			}
			scalar := shm.Tensor{Name: "scalar", DType: dtype.Int64, Payload: make([]byte, 8), Meta: []byte(`{"k":1}`)}
			want = append(want, scalar)
			if err := h.put(&scalar); err != nil {
				t.Fatal(err)
			}
			res, err := h.finish(StatusComplete)
			if err != nil {
				t.Fatal(err)
			}
			st, err := pipelinetest.ReadFile(h.out.Name())
			if err != nil {
				t.Fatal(err)
			}
			if st.EndStatus() != StatusComplete || !st.Footer {
				t.Fatalf("end %q footer %v", st.EndStatus(), st.Footer)
			}
			got, err := st.Tensors()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d tensors, want %d", len(got), len(want))
			}
			for i := range want {
				if got[i].Name != want[i].Name || got[i].DType != want[i].DType || got[i].Step != want[i].Step {
					t.Fatalf("tensor %d: %s %s step %d", i, got[i].Name, got[i].DType, got[i].Step)
				}
				if err := pipelinetest.Equal(got[i].Payload, want[i].Payload); err != nil {
					t.Fatalf("tensor %d (%s): %v", i, want[i].Name, err)
				}
			}
			if res.Packets != uint64(len(st.Packets)) || res.FileBytes != uint64(fileSize(t, h.out)) {
				t.Fatalf("result %+v, %d packets, file %d", res, len(st.Packets), fileSize(t, h.out))
			}
			for i, p := range st.Packets {
				if p.Seq != uint64(i+1) {
					t.Fatalf("packet %d has seq %d", i, p.Seq)
				}
			}
			// The header is the typed StreamMeta: the client's object nested, the codec named.
			if cm, _ := st.Meta["client_metadata"].(map[string]any); cm["test"] != true || st.Meta["codec"] == nil {
				t.Fatalf("metadata %v", st.Meta)
			}
		})
	}
}

// TestLossyMeta: a lossy codec's packets carry the achieved error under meta "lossy",
// within the bound, and the client's own meta keys are kept.
func TestLossyMeta(t *testing.T) {
	h := newHarness(t, hopts{codec: "quant", lossy: &codec.LossyBound{Mode: "rel", Value: 1e-3}, blockSize: 16 << 10})
	tn := f32Tensor("m", 3, 100, 300)
	tn.Meta = []byte(`{"dim":1}`)
	if err := h.put(&tn); err != nil {
		t.Fatal(err)
	}
	if _, err := h.finish(StatusComplete); err != nil {
		t.Fatal(err)
	}
	st, err := pipelinetest.ReadFile(h.out.Name())
	if err != nil {
		t.Fatal(err)
	}
	p := st.Packets[0]
	l, ok := p.Meta["lossy"].(map[string]any)
	if !ok || p.Meta["dim"] != float64(1) || l["mode"] != "rel" || l["bound"] != 1e-3 {
		t.Fatalf("meta %v", p.Meta)
	}
	if e, _ := l["rel_l2_err"].(float64); !(e > 0 && e <= 1e-3) {
		t.Fatalf("rel_l2_err %v", l["rel_l2_err"])
	}
	if p.StoredLen*2 > p.RawLen {
		t.Fatalf("quant stored %d of %d bytes", p.StoredLen, p.RawLen)
	}
}

func fileSize(t *testing.T, f *os.File) int64 {
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestDropsAndTokensInOrder(t *testing.T) {
	h := newHarness(t, hopts{codec: "lz4"})
	a := f32Tensor("a", 1, 100)
	if err := h.put(&a); err != nil {
		t.Fatal(err)
	}
	seq := h.p.TakeSeq()
	if err := h.s.Drop(Drop{Seq: seq, Name: "b", Step: 3, Forward: 1, Bytes: 4096, Reason: "ring_full"}); err != nil {
		t.Fatal(err)
	}
	h.drops++
	if err := h.s.Token(Token{Seq: h.p.TakeSeq(), Index: 3, TokenID: 42, Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	c := f32Tensor("c", 2, 100)
	if err := h.put(&c); err != nil {
		t.Fatal(err)
	}
	res, err := h.finish(StatusComplete)
	if err != nil {
		t.Fatal(err)
	}
	st, err := pipelinetest.ReadFile(h.out.Name())
	if err != nil {
		t.Fatal(err)
	}
	types := []stream.PacketType{}
	for _, p := range st.Packets {
		types = append(types, p.Type)
	}
	if len(types) != 4 || types[0] != 1 || types[1] != 2 || types[2] != 3 || types[3] != 1 {
		t.Fatalf("packet types %v", types)
	}
	d := st.Packets[1]
	if d.Name != "b" || d.RawLen != 4096 || d.Meta["reason"] != "ring_full" || d.Seq != 2 {
		t.Fatalf("drop packet %+v", d)
	}
	if res.Drops != 1 || st.End.Meta["drops"] != float64(1) {
		t.Fatalf("drops: result %d, end %v", res.Drops, st.End.Meta)
	}
}

func TestSessionErrors(t *testing.T) {
	le := binary.LittleEndian
	tests := []struct {
		name     string
		corrupt  func(h *harness, recPos uint64)
		wantKind Kind
		wantSub  string
	}{
		{"torn seq", func(h *harness, pos uint64) { le.PutUint64(h.p.Mem()[shm.HeaderSize+pos+8:], 9) }, KindTornRecord, "seq 9, expected 2"},
		{"bad magic", func(h *harness, pos uint64) { h.p.Mem()[shm.HeaderSize+pos] = 'X' }, KindBadRecord, "magic"},
		{"lying length", func(h *harness, pos uint64) { le.PutUint64(h.p.Mem()[shm.HeaderSize+pos+16:], 1<<30) }, KindBadRecord, "record_len"},
		{"lying shape", func(h *harness, pos uint64) { le.PutUint64(h.p.Mem()[shm.HeaderSize+pos+80:], 1000) }, KindBadRecord, "shape"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hopts{codec: "zstd"})
			a := f32Tensor("a", 1, 64)
			if err := h.put(&a); err != nil {
				t.Fatal(err)
			}
			b := f32Tensor("b", 2, 64)
			pos := h.p.Head()
			if _, err := h.p.Put(&b); err != nil {
				t.Fatal(err)
			}
			tc.corrupt(h, pos)
			err := h.s.Publish(h.p.Head(), 2)
			var se *Error
			if !errors.As(err, &se) || se.Kind != tc.wantKind || !strings.Contains(se.Error(), tc.wantSub) {
				t.Fatalf("err = %v, want kind %s containing %q", err, tc.wantKind, tc.wantSub)
			}
			if e := <-h.errs; KindOf(e) != tc.wantKind {
				t.Fatalf("OnError got %v", e)
			}
			if err := h.s.Publish(h.p.Head(), 2); err == nil {
				t.Fatal("publish after failure succeeded")
			}
			res, err := h.s.Finish(StatusComplete)
			if err == nil || res.Status != StatusError {
				t.Fatalf("finish: %+v %v", res, err)
			}
			st, rerr := pipelinetest.ReadFile(h.out.Name())
			if rerr != nil {
				t.Fatal(rerr)
			}
			// The good record before the bad one is kept; the stream ends with status error.
			if st.EndStatus() != StatusError || len(st.Packets) != 1 || st.Packets[0].Name != "a" {
				t.Fatalf("end %q, %d packets", st.EndStatus(), len(st.Packets))
			}
			if msg, _ := st.End.Meta["error"].(string); !strings.Contains(msg, tc.wantSub) {
				t.Fatalf("END error %q", msg)
			}
		})
	}
	t.Run("close mismatch", func(t *testing.T) {
		h := newHarness(t, hopts{})
		a := f32Tensor("a", 1, 64)
		if err := h.put(&a); err != nil {
			t.Fatal(err)
		}
		err := h.s.CheckClose(Close{Seq: 5, Head: h.p.Head()})
		if err == nil || !strings.Contains(err.Error(), "close seq 5, last sequence number received 1") {
			t.Fatalf("err = %v", err)
		}
		h.s.Finish(StatusComplete)
	})
	t.Run("head beyond ring", func(t *testing.T) {
		h := newHarness(t, hopts{ringSize: shm.HeaderSize + 4096})
		err := h.s.Publish(8192, 1)
		if err == nil || !strings.Contains(err.Error(), "more than data_size 4096") {
			t.Fatalf("err = %v", err)
		}
		h.s.Finish(StatusComplete)
	})
	// Notices whose text json.Marshal would rewrite to U+FFFD: refused, never written.
	for _, tc := range []struct {
		name   string
		notice func(h *harness) error
		sub    string
	}{
		{"token text not UTF-8", func(h *harness) error {
			return h.s.Token(Token{Seq: h.p.TakeSeq(), Index: 0, TokenID: 1, Text: "model.\xff\xfe"})
		}, `token seq 2: text "model.\xff\xfe" is not valid UTF-8`},
		{"drop name not UTF-8", func(h *harness) error {
			return h.s.Drop(Drop{Seq: h.p.TakeSeq(), Name: "model.\xff\xfe", Bytes: 4})
		}, `drop seq 2: name "model.\xff\xfe"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hopts{})
			a := f32Tensor("a", 1, 64)
			if err := h.put(&a); err != nil {
				t.Fatal(err)
			}
			err := tc.notice(h)
			var se *Error
			if !errors.As(err, &se) || se.Kind != KindBadRequest || !strings.Contains(se.Error(), tc.sub) {
				t.Fatalf("err = %v, want kind %s containing %q", err, KindBadRequest, tc.sub)
			}
			res, err := h.s.Finish(StatusComplete)
			if err == nil || res.Status != StatusError {
				t.Fatalf("finish: %+v %v", res, err)
			}
			st, rerr := pipelinetest.ReadFile(h.out.Name())
			if rerr != nil || st.EndStatus() != StatusError || len(st.Packets) != 1 {
				t.Fatalf("%v: end %q, %d packets", rerr, st.EndStatus(), len(st.Packets))
			}
		})
	}
	t.Run("aborted", func(t *testing.T) {
		h := newHarness(t, hopts{codec: "lz4"})
		a := f32Tensor("a", 1, 64)
		if err := h.put(&a); err != nil {
			t.Fatal(err)
		}
		res, err := h.s.Finish(StatusAborted)
		if err != nil || res.Status != StatusAborted {
			t.Fatalf("%+v %v", res, err)
		}
		st, err := pipelinetest.ReadFile(h.out.Name())
		if err != nil || st.EndStatus() != StatusAborted || len(st.Packets) != 1 {
			t.Fatalf("%v %+v", err, st)
		}
	})
}

func TestBudget(t *testing.T) {
	b := NewBudget(1000)
	l1, err := b.Open(600, 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Open(300, 100); !errors.Is(err, ErrBudget) {
		t.Fatalf("err = %v, want ErrBudget", err)
	}
	// 300 free: three grants fit the shared budget; the fourth takes the reserve; the
	// fifth waits.
	g1, err := l1.acquire(t.Context(), 100)
	if err != nil || g1.slot {
		t.Fatalf("%+v %v", g1, err)
	}
	g2, _ := l1.acquire(t.Context(), 100)
	g3, _ := l1.acquire(t.Context(), 100)
	if g2.slot || g3.slot || b.Used() != 1000 {
		t.Fatalf("used %d", b.Used())
	}
	g4, _ := l1.acquire(t.Context(), 100)
	if !g4.slot {
		t.Fatal("fourth grant should use the reserve")
	}
	if _, err := l1.acquire(t.Context(), 101); err == nil {
		t.Fatal("grant larger than the reserve accepted")
	}
	got := make(chan grant)
	go func() {
		g, _ := l1.acquire(t.Context(), 100)
		got <- g
	}()
	select {
	case <-got:
		t.Fatal("acquire did not wait")
	case <-time.After(20 * time.Millisecond):
	}
	l1.release(g1)
	if g := <-got; g.slot {
		t.Fatal("waiter should get shared budget")
	}
	l1.release(g2)
	l1.release(g3)
	l1.release(g4)
	l1.Close()
	if b.Used() != 100 {
		t.Fatalf("used %d after close, want the one grant still out", b.Used())
	}
}

// TestTightBudget runs a compressed session whose budget holds its ring and exactly one
// buffer: blocks must wait for each other, and everything still arrives.
func TestTightBudget(t *testing.T) {
	const ring = shm.HeaderSize + 256<<10
	c, _ := codec.New("zstd", codec.Options{})
	budget := NewBudget(ring + Reserve(c, 8<<10, ring-shm.HeaderSize))
	h := newHarness(t, hopts{codec: "zstd", ringSize: ring, blockSize: 8 << 10, budget: budget})
	tn := f32Tensor("big", 7, 200, 1000)
	if err := h.put(&tn); err != nil {
		t.Fatal(err)
	}
	if _, err := h.finish(StatusComplete); err != nil {
		t.Fatal(err)
	}
	st, err := pipelinetest.ReadFile(h.out.Name())
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Tensors()
	if err != nil || len(got) != 1 {
		t.Fatal(err)
	}
	if err := pipelinetest.Equal(got[0].Payload, tn.Payload); err != nil {
		t.Fatal(err)
	}
	if budget.Used() != 0 {
		t.Fatalf("budget used %d after finish", budget.Used())
	}
}

func BenchmarkPipeline(b *testing.B) {
	const tensorElems = 1 << 20 // 4 MiB of float32
	for _, name := range []string{"none", "lz4", "zstd"} {
		b.Run(name, func(b *testing.B) {
			pool := NewPool(0, false)
			defer pool.Close()
			h := newHarness(b, hopts{codec: name, ringSize: shm.HeaderSize + 64<<20, pool: pool})
			tn := shm.Tensor{Name: "model.layers.0.mlp", DType: dtype.Float32, Shape: []uint64{tensorElems},
				Payload: pipelinetest.Activations(1, tensorElems)}
			b.ReportAllocs()
			b.SetBytes(int64(len(tn.Payload)))
			b.ResetTimer()
			for range b.N {
				if err := h.put(&tn); err != nil {
					b.Fatal(err)
				}
			}
			res, err := h.finish(StatusComplete)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if res.Packets != uint64(b.N) {
				b.Fatalf("%d packets, want %d", res.Packets, b.N)
			}
			b.ReportMetric(float64(res.BytesIn)/float64(res.FileBytes), "ratio")
		})
	}
}

// TestWriteErrorReachesClient: a failing output (here /dev/full: every write is ENOSPC once
// the writer flushes) becomes a fatal write_error for the session, never swallowed.
func TestWriteErrorReachesClient(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full")
	}
	h := newHarness(t, hopts{codec: "lz4", output: full})
	for i := range 50 {
		tn := f32Tensor("m", uint64(i+1), 20000)
		if err = h.put(&tn); err != nil {
			break
		}
	}
	_, ferr := h.s.Finish(StatusComplete)
	if ferr == nil {
		t.Fatal("finish succeeded on a closed output")
	}
	select {
	case e := <-h.errs:
		if KindOf(e) != KindWrite {
			t.Fatalf("OnError kind %s (%v), want %s", KindOf(e), e, KindWrite)
		}
	default:
		t.Fatalf("no error reported to the client (put: %v, finish: %v)", err, ferr)
	}
}

// With DurableEvery the writer fdatasyncs and reports the stream's size each time that many
// bytes were written: offsets grow by at least that much, end at packet boundaries, and
// never pass what the file holds.
func TestDurableEvery(t *testing.T) {
	var mu sync.Mutex
	var offs []uint64
	h := newHarness(t, hopts{ringSize: shm.HeaderSize + 4<<20, durableEvery: 256 << 10, onDurable: func(o uint64) {
		mu.Lock()
		offs = append(offs, o)
		mu.Unlock()
	}})
	for i := range 40 {
		tn := f32Tensor("model.layers.0.mlp", uint64(i+1), 32<<10) // 128 KiB each
		if err := h.put(&tn); err != nil {
			t.Fatal(err)
		}
	}
	res, err := h.finish(StatusComplete)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(offs) < 15 {
		t.Fatalf("%d durable reports for %d bytes every 256 KiB", len(offs), res.FileBytes)
	}
	// Packet boundaries: where each packet (END included) starts.
	rd, f, err := stream.OpenFile(h.out.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bounds := map[uint64]bool{}
	for sc := rd.Scan(true); sc.Next(); {
		bounds[uint64(sc.Packet().Offset)] = true
	}
	prev := uint64(0)
	for _, o := range offs {
		if o < prev+256<<10 || o > res.FileBytes || !bounds[o] {
			t.Fatalf("durable offset %d after %d (file %d bytes; packet end: %v)", o, prev, res.FileBytes, bounds[o])
		}
		prev = o
	}
}
