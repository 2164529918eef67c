package pipeline

import (
	"fmt"
	"sync"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/stream"
)

// Reserve is the compression buffer memory a session must reserve at open so that its
// largest possible record (one filling the data region) can always be compressed: 0 for
// codec none, which writes straight from the ring.
func Reserve(c codec.Codec, blockSize int, dataSize uint64) int64 {
	if c == nil || c.ID() == codec.None {
		return 0
	}
	if blockSize <= 0 {
		blockSize = DefaultBlockSize
	}
	full := int64(dataSize) / int64(blockSize)
	r := full * int64(bufCap(blockSize))
	if rest := int(int64(dataSize) % int64(blockSize)); rest > 0 {
		r += int64(bufCap(rest))
	}
	return r
}

// bufCap is the capacity of a compression buffer for a block of n raw bytes: room for
// codecs that expand incompressible input a little before giving up.
func bufCap(n int) int { return n + n/64 + 1024 }

// dispatch queues it for the writer and, for compressed codecs, its blocks for the pool.
// The item is queued before its blocks are submitted so the writer waits on it in order
// while they compress.
func (s *Session) dispatch(it *item) error {
	if s.codec == nil || it.kind != kindTensor {
		close(it.done)
		return s.enqueue(it)
	}
	p := it.rec.Payload
	n := (len(p) + s.bs - 1) / s.bs
	if it.coded != nil {
		n = it.coded.Blocks()
	}
	it.blocks = make([]stream.Block, n)
	it.grants = make([]grant, n)
	if n == 0 {
		s.tail.free(it.span)
		close(it.done)
		return s.enqueue(it)
	}
	enc, se, withStats, err := s.encoderFor(it)
	if err != nil {
		s.tail.free(it.span)
		return s.fail(err)
	}
	if withStats {
		it.stats = make([]codec.BlockStats, n)
	}
	it.pending.Store(int32(n))
	if err := s.enqueue(it); err != nil {
		return err
	}
	for i := range n {
		var src []byte
		need := 0
		if it.coded == nil {
			src = p[i*s.bs : min(len(p), (i+1)*s.bs)]
			need = bufCap(len(src))
		} else {
			need = it.coded.BlockLen(i)
		}
		g, err := s.o.Lease.acquire(s.ctx, int64(need))
		if err != nil {
			s.abandon(it, n-i, err)
			return s.fail(&Error{Kind: KindInternal, Err: fmt.Errorf("wait for memory budget: %w", err)})
		}
		it.grants[i] = g
		job := func() {
			s.compressBlock(it, i, src, enc, se, withStats)
			s.blockDone(it)
		}
		if err := s.o.Pool.Submit(s.ctx, job); err != nil {
			s.abandon(it, n-i, err)
			return s.fail(&Error{Kind: KindInternal, Err: fmt.Errorf("submit block: %w", err)})
		}
	}
	return nil
}

// encoderFor is the encoder of it's blocks: the session's codec, or the one a
// codec.TensorPreparer derives from the whole record (e.g. the RMS a relative bound refers
// to); se is set when it reports block stats (lossy codecs).
func (s *Session) encoderFor(it *item) (enc codec.Codec, se codec.StatsEncoder, withStats bool, err error) {
	if it.coded != nil { // coded by the client: compressBlock copies its blocks
		return nil, nil, true, nil
	}
	enc = s.codec
	rp, byRows := enc.(codec.RowPreparer)
	if sh := it.rec.Shape; byRows && len(sh) > 0 && sh[len(sh)-1] > 0 && sh[len(sh)-1] <= 1<<40 {
		// fp8's scale per row: the last dimension; a PART starts skip values into a row.
		w, row := uint64(max(1, it.rec.DType.Size())), sh[len(sh)-1]
		c, err := rp.ForRows(it.rec.Payload, it.rec.DType, int(row), int(it.rec.PartOffset/w%row))
		if err != nil {
			return nil, nil, false, &Error{Kind: KindCodec, Err: fmt.Errorf("prepare seq %d (%s): %w", it.seq, it.rec.Name, err)}
		}
		enc = c
	} else if tp, ok := enc.(codec.TensorPreparer); ok {
		c, err := tp.ForTensor(it.rec.Payload, it.rec.DType)
		if err != nil {
			return nil, nil, false, &Error{Kind: KindCodec, Err: fmt.Errorf("prepare seq %d (%s): %w", it.seq, it.rec.Name, err)}
		}
		enc = c
	}
	se, withStats = enc.(codec.StatsEncoder)
	return enc, se, withStats, nil
}

// compressBlock compresses block i of it (src), within the CPU budget: past it the block
// is stored raw. The result goes to it.blocks[i] (it.stats[i] with stats), an error to it.
func (s *Session) compressBlock(it *item, i int, src []byte, enc codec.Codec, se codec.StatsEncoder, withStats bool) {
	dt := it.rec.DType
	if it.coded != nil {
		// Coded by the client: the block is copied out of the ring, never stored raw (the
		// raw values are not there), so the CPU budget is not asked.
		out, st, err := it.coded.Block(getBuf(it.coded.BlockLen(i)), i)
		if err != nil {
			it.setErr(fmt.Errorf("block %d: %w", i, err))
			putBuf(out)
			return
		}
		it.blocks[i], it.stats[i] = stream.Block{Data: out}, st
		return
	}
	buf := getBuf(bufCap(len(src)))
	var (
		out        []byte
		compressed bool
		err        error
	)
	var m meter
	if s.o.CPU != nil {
		m = startMeter()
	}
	switch {
	case !s.o.CPU.take():
		s.cpuRaw.Add(1)
		out = buf[:0]
		if withStats {
			it.stats[i] = codec.BlockStats{Values: len(src) / max(1, dt.Size()), Lossless: true}
		}
	case withStats:
		var st codec.BlockStats
		out, compressed, st, err = se.EncodeStats(buf[:0], src, dt)
		if !compressed {
			st = codec.BlockStats{Values: len(src) / max(1, dt.Size()), Lossless: true}
		}
		it.stats[i] = st
		s.o.CPU.charge(m.elapsed())
	default:
		out, compressed, err = enc.Encode(buf[:0], src, dt)
		s.o.CPU.charge(m.elapsed())
	}
	switch {
	case err != nil:
		it.setErr(fmt.Errorf("block %d: %w", i, err))
		putBuf(buf)
	case compressed:
		it.blocks[i] = stream.Block{Data: out}
	default:
		// Stored verbatim: copy, since the ring bytes are released before writing.
		it.blocks[i] = stream.Block{Data: append(out[:0], src...), Raw: true}
	}
}

// abandon counts the left blocks of it that will never be submitted as done, with err, so
// the writer is not left waiting for them.
func (s *Session) abandon(it *item, left int, err error) {
	it.setErr(err)
	for range left {
		s.blockDone(it)
	}
}

// blockDone counts one finished block; the last one frees the ring bytes.
func (s *Session) blockDone(it *item) {
	if it.pending.Add(-1) == 0 {
		s.tail.free(it.span)
		close(it.done)
	}
}

// enqueue hands it to the writer, in sequence order.
func (s *Session) enqueue(it *item) error {
	if s.writeNow(it) {
		return nil
	}
	s.queued.Add(1)
	select {
	case s.queue <- it:
		return nil
	case <-s.ctx.Done():
		s.queued.Add(-1)
		return s.fail(&Error{Kind: KindInternal, Err: s.ctx.Err()})
	}
}

// bufPool recycles compression buffers across sessions: they are large and short-lived.
// It holds them as *[]byte (a pool of plain slices would allocate a header per Put); the
// pointers themselves come back through hdrPool, so a buffer's round trip allocates
// nothing (one per record of a decode token before issue 38).
var bufPool, hdrPool sync.Pool

func getBuf(n int) []byte {
	if v, ok := bufPool.Get().(*[]byte); ok {
		b := *v
		*v = nil
		hdrPool.Put(v)
		if cap(b) >= n {
			return b[:0]
		}
	}
	return make([]byte, 0, n)
}

func putBuf(b []byte) {
	v, ok := hdrPool.Get().(*[]byte)
	if !ok {
		v = new([]byte)
	}
	*v = b[:0]
	bufPool.Put(v)
}
