package pipeline

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// putWindow places ts in the ring without publishing, so that one Publish then takes them
// all (one decoding step's window).
func (h *harness) putWindow(ts []shm.Tensor) {
	h.tb.Helper()
	for i := range ts {
		for _, part := range h.p.Split(&ts[i]) {
			if !h.p.Fits(&part) {
				h.tb.Fatalf("window does not fit the ring at tensor %d", i)
			}
			seq, err := h.p.Put(&part)
			if err != nil {
				h.tb.Fatal(err)
			}
			h.lastSeq = seq
		}
	}
}

// checkTensors reads the stream back and compares its TENSOR packets with want, in order,
// payloads byte for byte, and checks that sequence numbers run 1, 2, ... with none lost.
func checkTensors(t *testing.T, h *harness, want []shm.Tensor) *pipelinetest.Stream {
	t.Helper()
	st, err := pipelinetest.ReadFile(h.out.Name())
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range st.Packets {
		if p.Seq != uint64(i+1) {
			t.Fatalf("packet %d (%s) has seq %d, want %d", i, p.Name, p.Seq, i+1)
		}
	}
	got, err := st.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d tensors, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Name != want[i].Name || got[i].Step != want[i].Step {
			t.Fatalf("tensor %d is %s step %d, want %s step %d", i, got[i].Name, got[i].Step, want[i].Name, want[i].Step)
		}
		if err := pipelinetest.Equal(got[i].Payload, want[i].Payload); err != nil {
			t.Fatalf("tensor %d (%s): %v", i, want[i].Name, err)
		}
	}
	return st
}

// decodeWindow is one window of many small records (more than one batch holds) with large
// ones and an empty one among them: the order and every byte must survive the batches.
func decodeWindow(step uint64) []shm.Tensor {
	var ts []shm.Tensor
	for i := range batchRecords + 40 {
		n := uint64(64 + 37*(i%11)) // 256 B .. 1.7 KiB of float32
		ts = append(ts, f32Tensor(fmt.Sprintf("model.layers.%d.out", i), step*1000+uint64(i), n))
		switch i {
		case 17, 200:
			// Larger than a batch record: the per-block path, between batched ones.
			ts = append(ts, f32Tensor(fmt.Sprintf("big.%d", i), step*1000+500+uint64(i), 70<<10/4))
		case 90:
			ts = append(ts, shm.Tensor{Name: "empty", DType: dtype.Float32, Shape: []uint64{0}, Step: step})
		case 91:
			ts = append(ts, shm.Tensor{Name: "with meta", DType: dtype.Int64, Payload: make([]byte, 8),
				Meta: []byte(`{"k":1}`), Step: step})
		}
	}
	return ts
}

// TestBatchedWindowExact: windows of small records mixed with large ones come out whole and
// in order, for every codec and on both batch paths (compressed on the connection's
// goroutine; one pool job under idle workers).
func TestBatchedWindowExact(t *testing.T) {
	for _, idle := range []bool{false, true} {
		for _, name := range []string{"none", "lz4", "zstd", "shuffle"} {
			t.Run(fmt.Sprintf("%s/idle=%v", name, idle), func(t *testing.T) {
				pool := NewPoolWith(PoolOptions{Workers: 2, IdleWorkers: idle})
				t.Cleanup(pool.Close)
				h := newHarness(t, hopts{codec: name, ringSize: shm.HeaderSize + 4<<20, pool: pool})
				if on, _ := pool.Idle(); h.s.inline == on {
					t.Fatalf("inline %v with idle workers %v", h.s.inline, on)
				}
				var want []shm.Tensor
				for step := range uint64(3) {
					w := decodeWindow(step + 1)
					h.putWindow(w)
					want = append(want, w...)
					if err := h.publish(); err != nil {
						t.Fatal(err)
					}
					// A token between windows, as in decoding.
					if err := h.s.Token(Token{Seq: h.p.TakeSeq(), Index: step, TokenID: int64(step), Text: "t"}); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := h.finish(StatusComplete); err != nil {
					t.Fatal(err)
				}
				st := checkTensors(t, h, want)
				tokens := 0
				for _, p := range st.Packets {
					if p.Type == stream.TypeToken {
						tokens++
					}
				}
				if tokens != 3 {
					t.Fatalf("%d tokens, want 3", tokens)
				}
			})
		}
	}
}

// TestBatchFitsReserve: a window of small records whose buffers together exceed the
// session's reserve, under a budget with no shared room. A batch that took them all
// before being queued would wait for memory forever; batches are cut to fit the reserve.
func TestBatchFitsReserve(t *testing.T) {
	const ring = shm.HeaderSize + 128<<10
	const bs = 8 << 10
	c, err := codec.New("lz4", codec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reserve := Reserve(c, bs, ring-shm.HeaderSize)
	budget := NewBudget(ring + reserve) // exactly the session's own: no shared room
	h := newHarness(t, hopts{codec: "lz4", ringSize: ring, blockSize: bs, budget: budget})
	var w []shm.Tensor
	var grants int64
	for i := range 100 {
		tn := f32Tensor(fmt.Sprintf("r%d", i), uint64(i+1), 256)
		grants += int64(bufCap(len(tn.Payload)))
		w = append(w, tn)
	}
	if grants <= reserve {
		t.Fatalf("test setup: %d bytes of buffers fit the reserve %d", grants, reserve)
	}
	h.putWindow(w)
	done := make(chan error, 1)
	go func() { done <- h.publish() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("publish still waiting for memory after 20s")
	}
	if _, err := h.finish(StatusComplete); err != nil {
		t.Fatal(err)
	}
	checkTensors(t, h, w)
	if budget.Used() != 0 {
		t.Fatalf("budget used %d after finish", budget.Used())
	}
}

// TestBatchedRecordsFreeRing: ring space of batched records comes back (the client can
// publish many times the ring's size in small records).
func TestBatchedRecordsFreeRing(t *testing.T) {
	for _, name := range []string{"none", "shuffle"} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, hopts{codec: name, ringSize: shm.HeaderSize + 64<<10})
			var want []shm.Tensor
			for i := range 2000 { // ≈ 20 times the ring
				tn := f32Tensor("r", uint64(i+1), 128)
				want = append(want, tn)
				if err := h.put(&tn); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := h.finish(StatusComplete); err != nil {
				t.Fatal(err)
			}
			checkTensors(t, h, want)
		})
	}
}

// TestBatchBadRecordKeepsEarlier: a window whose middle record is torn (wrong seq): the
// records before it in the same batch are written, the session fails, nothing after it
// is written.
func TestBatchBadRecordKeepsEarlier(t *testing.T) {
	for _, name := range []string{"none", "lz4"} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, hopts{codec: name})
			var w []shm.Tensor
			for i := range 5 {
				w = append(w, f32Tensor(fmt.Sprintf("r%d", i), uint64(i+1), 100))
			}
			h.putWindow(w)
			h.p.TakeSeq() // a sequence number skipped: the next record is torn
			bad := []shm.Tensor{f32Tensor("torn", 9, 100), f32Tensor("after", 10, 100)}
			h.putWindow(bad)
			err := h.publish()
			if KindOf(err) != KindTornRecord {
				t.Fatalf("publish: %v", err)
			}
			h.s.Finish(StatusAborted)
			st := checkTensors(t, h, w)
			if st.EndStatus() != StatusError {
				t.Fatalf("end status %q", st.EndStatus())
			}
		})
	}
}

// BenchmarkDecodeWindow is one decoding step's window (24 records of 2 KiB, a Llama
// 512×8's residual, attention and MLP outputs) through Publish to the file.
func BenchmarkDecodeWindow(b *testing.B) {
	for _, name := range []string{"none", "shuffle"} {
		b.Run(name, func(b *testing.B) {
			h := newHarness(b, hopts{codec: name, ringSize: shm.HeaderSize + 8<<20})
			w := decodeToken()
			b.ReportAllocs()
			b.SetBytes(int64(24 * 2048))
			for range b.N {
				h.publishToken(w)
			}
			if _, err := h.finish(StatusComplete); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// decodeToken is one decoding step's window of a small model: 24 records of 2 KiB fp32.
func decodeToken() []shm.Tensor {
	w := make([]shm.Tensor, 24)
	for i := range w {
		w[i] = f32Tensor(fmt.Sprintf("model.layers.%d.mlp", i/3), uint64(i+1), 512)
	}
	return w
}

// publishToken puts w in the ring (waiting for releases when it is full) and publishes it.
func (h *harness) publishToken(w []shm.Tensor) {
	for i := range w {
		for !h.p.Fits(&w[i]) {
			if err := h.publish(); err != nil {
				h.tb.Fatal(err)
			}
			<-h.rel
			if err := h.p.Release(h.tail.Load()); err != nil {
				h.tb.Fatal(err)
			}
		}
		seq, err := h.p.Put(&w[i])
		if err != nil {
			h.tb.Fatal(err)
		}
		h.lastSeq = seq
	}
	if err := h.publish(); err != nil {
		h.tb.Fatal(err)
	}
}

// TestDecodeWindowAllocs: a decoding step's window costs the daemon almost no allocation
// once warm (issue 38: an item of ≈ 1 KiB per record ran the collector about once per
// 128-token capture). Before the items were recycled a 24-record window took 32.
func TestDecodeWindowAllocs(t *testing.T) {
	for _, name := range []string{"none", "shuffle"} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, hopts{codec: name, ringSize: shm.HeaderSize + 8<<20})
			w := decodeToken()
			h.publishToken(w) // warm: pools, the tracker's and the index's arrays
			h.publishToken(w)
			var want []shm.Tensor
			n := testing.AllocsPerRun(50, func() { h.publishToken(w) })
			for range 2 + 51 {
				want = append(want, w...)
			}
			if _, err := h.finish(StatusComplete); err != nil {
				t.Fatal(err)
			}
			checkTensors(t, h, want)
			// The batch's done channel, and now and then the stream index's growth.
			if n > 4 && !raceEnabled {
				t.Fatalf("%.1f allocations per 24-record window, want at most 4", n)
			}
		})
	}
}

// TestBatchedLossyMeta: batched records of a lossy codec get their encoder from the whole
// record (a rel bound's RMS) and carry their error report, within the bound.
func TestBatchedLossyMeta(t *testing.T) {
	h := newHarness(t, hopts{codec: "quant", lossy: &codec.LossyBound{Mode: "rel", Value: 1e-3}})
	var w []shm.Tensor
	for i := range 10 {
		tn := f32Tensor(fmt.Sprintf("m%d", i), uint64(i+3), 512)
		tn.Meta = []byte(`{"dim":1}`)
		w = append(w, tn)
	}
	h.putWindow(w)
	if err := h.publish(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.finish(StatusComplete); err != nil {
		t.Fatal(err)
	}
	st, err := pipelinetest.ReadFile(h.out.Name())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Packets) != len(w) {
		t.Fatalf("%d packets, want %d", len(st.Packets), len(w))
	}
	for i, p := range st.Packets {
		l, ok := p.Meta["lossy"].(map[string]any)
		if p.Name != w[i].Name || !ok || p.Meta["dim"] != float64(1) || l["mode"] != "rel" {
			t.Fatalf("packet %d %s meta %v", i, p.Name, p.Meta)
		}
		if e, _ := l["rel_l2_err"].(float64); !(e > 0 && e <= 1e-3) {
			t.Fatalf("packet %d rel_l2_err %v", i, l["rel_l2_err"])
		}
	}
}

// TestBatchCPUBudget: batched records are compressed within the CPU budget like blocks
// on the pool: with a budget of 0 CPUs every one of them is stored raw, and counted.
func TestBatchCPUBudget(t *testing.T) {
	cpu := NewCPUBudget(0)
	h := newHarness(t, hopts{codec: "shuffle", cpu: cpu})
	if !h.s.inline {
		t.Fatal("not compressing batches inline")
	}
	var w []shm.Tensor
	for i := range 20 {
		w = append(w, f32Tensor(fmt.Sprintf("r%d", i), uint64(i+1), 256))
	}
	h.putWindow(w)
	if err := h.publish(); err != nil {
		t.Fatal(err)
	}
	res, err := h.finish(StatusComplete)
	if err != nil {
		t.Fatal(err)
	}
	if res.CPURawBlocks != 20 || cpu.RawBlocks() != 20 {
		t.Fatalf("raw blocks: session %d, budget %d; want 20", res.CPURawBlocks, cpu.RawBlocks())
	}
	checkTensors(t, h, w)
}

// TestRingTokens: TOKEN records in the ring (PROTOCOL.md 2) become TOKEN packets in
// sequence order with the records around them, several tokens' windows under one Publish
// whose seq is the last record's, for every codec, on both batch paths, and through the
// drain of a dead client's published cursor; a token's text that is not UTF-8 is refused.
func TestRingTokens(t *testing.T) {
	for _, idle := range []bool{false, true} {
		for _, name := range []string{"none", "shuffle"} {
			for _, drain := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/idle=%v/drain=%v", name, idle, drain), func(t *testing.T) {
					pool := NewPoolWith(PoolOptions{Workers: 2, IdleWorkers: idle})
					t.Cleanup(pool.Close)
					h := newHarness(t, hopts{codec: name, ringSize: shm.HeaderSize + 1<<20, pool: pool})
					var want []shm.Tensor
					var order []string // "T" tensor, "K" token, in sequence order
					for step := range uint64(5) {
						var w []shm.Tensor
						for i := range 24 {
							w = append(w, f32Tensor(fmt.Sprintf("model.layers.%d", i), step*100+uint64(i), 512))
						}
						if step == 2 {
							w = append(w, f32Tensor("big", 77, 70<<10/4)) // the per-block path between them
						}
						h.putWindow(w)
						want = append(want, w...)
						for range w {
							order = append(order, "T")
						}
						seq, err := h.p.PutToken(step, int64(1000+step), int64(32+step), fmt.Sprintf("tok%d é", step))
						if err != nil {
							t.Fatal(err)
						}
						h.lastSeq = seq
						order = append(order, "K")
					}
					if drain {
						// A dead client's cursor: every window below it is taken.
						binary.LittleEndian.PutUint64(h.p.Mem()[32:], h.p.Head())
						n, err := h.s.DrainPublished()
						if err != nil || n != len(order) {
							t.Fatalf("drained %d records (%v), want %d", n, err, len(order))
						}
						if _, err := h.s.Finish(StatusAborted); err != nil {
							t.Fatal(err)
						}
					} else {
						if err := h.publish(); err != nil { // one message for five tokens
							t.Fatal(err)
						}
						if _, err := h.finish(StatusComplete); err != nil {
							t.Fatal(err)
						}
					}
					st := checkTensors(t, h, want)
					k := 0
					for i, p := range st.Packets {
						got := "T"
						if p.Type == stream.TypeToken {
							got = "K"
							var m stream.TokenMeta
							if b, err := json.Marshal(p.Meta); err != nil || json.Unmarshal(b, &m) != nil {
								t.Fatalf("token meta %v", p.Meta)
							}
							if p.Step != uint64(k) || m.TokenID != int64(1000+k) || m.Position != int64(32+k) || m.Text != fmt.Sprintf("tok%d é", k) {
								t.Fatalf("token %d: step %d meta %+v", k, p.Step, m)
							}
							k++
						}
						if got != order[i] {
							t.Fatalf("packet %d is %s, want %s", i, got, order[i])
						}
					}
					if k != 5 || h.s.Stats().Tokens != 5 {
						t.Fatalf("%d token packets, %d counted, want 5", k, h.s.Stats().Tokens)
					}
					if h.s.Stats().Tail != h.p.Head() {
						t.Fatalf("tail %d after finish, head %d: ring bytes not freed", h.s.Stats().Tail, h.p.Head())
					}
				})
			}
		}
	}
	t.Run("bad text", func(t *testing.T) {
		h := newHarness(t, hopts{})
		seq, err := h.p.PutToken(0, 1, 0, "ok")
		if err != nil {
			t.Fatal(err)
		}
		h.lastSeq = seq
		off := (h.p.Head() - shm.TokenRecordLen(2)) % h.p.DataSize()
		h.p.Mem()[shm.HeaderSize+off+128] = 0xff
		if err := h.publish(); err == nil || !strings.Contains(err.Error(), "not valid UTF-8") {
			t.Fatalf("err = %v", err)
		}
		h.s.Finish(StatusError)
	})
	t.Run("publish seq names the token", func(t *testing.T) {
		h := newHarness(t, hopts{})
		tn := f32Tensor("a", 1, 4)
		h.putWindow([]shm.Tensor{tn})
		tensorSeq := h.lastSeq
		if _, err := h.p.PutToken(0, 1, 0, "x"); err != nil {
			t.Fatal(err)
		}
		// The tensor's seq is not the window's last: a torn record.
		if err := h.s.Publish(h.p.Head(), tensorSeq); err == nil || !strings.Contains(err.Error(), "publish says last seq") {
			t.Fatalf("err = %v", err)
		}
		h.s.Finish(StatusError)
	})
}
