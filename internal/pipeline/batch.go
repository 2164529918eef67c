package pipeline

import (
	"fmt"
	"runtime"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/stream"
)

// Small records travel in batches. A decoding step publishes a few dozen records of a few
// KiB each (one token's residual, attention and MLP outputs); handed to the pool and the
// writer one by one, each of them woke a worker, then the writer, and the reader again
// when the pool's queue was full: ≈ 13 goroutine wake-ups per token, each of which can
// preempt one of the model's threads (PERFORMANCE.md, "Small records in batches"). A
// batch is one queue element: its records are compressed in one go and the writer takes
// them in one wake-up, in sequence order, and their ring bytes are freed together.
//
// Where the workers run at normal priority the connection's goroutine compresses a batch
// itself (a few µs per record): no worker is woken for it. Under IdleWorkers a batch is
// one pool job instead, so that compression keeps to the gaps the model leaves.

const (
	// smallRecord is the largest record that joins a batch (and no larger than one
	// block): one decoding step's records of any model this daemon serves on a CPU are
	// below it, a prefill's are above it and keep the per-block path.
	smallRecord = 64 << 10
	// batchBytes and batchRecords bound a batch: its compression on the connection's
	// goroutine stays in the hundreds of µs, and a batch never waits for many records.
	batchBytes   = 256 << 10
	batchRecords = 256
)

// batch collects consecutive small records of one window.
type batch struct {
	bt    *item // the element it becomes (newBatch), from its first record on
	items []*item
	bytes int   // payload bytes
	grant int64 // compression buffers its items will hold
}

// small reports whether it joins a batch: a small tensor record, or a TOKEN record (a
// notice, ready at once: compressBatch skips it and the writer writes its packet in place).
func (s *Session) small(it *item) bool {
	if it.coded != nil { // one block at most: the raw tensor's size decides
		return it.rec.TensorLen <= uint64(min(s.bs, smallRecord))
	}
	return it.kind == kindToken || len(it.rec.Payload) <= min(s.bs, smallRecord)
}

// route sends a taken record on its way: small ones into b, others (after b, to keep the
// order) to dispatch.
func (s *Session) route(b *batch, it *item) error {
	if !s.small(it) {
		if err := s.flush(b); err != nil {
			return err
		}
		it.done = make(chan struct{})
		return s.dispatch(it)
	}
	g := s.grantFor(it)
	// A batch's buffers are all taken before it is queued: their sum must fit in the
	// session's reserve, which the session always gets back once its earlier packets are
	// written, or the batch could wait for memory forever.
	if len(b.items) == batchRecords || b.bytes+len(it.rec.Payload) > batchBytes ||
		(g > 0 && b.grant+g > s.o.Lease.reserve) {
		if err := s.flush(b); err != nil {
			return err
		}
	}
	if b.bt == nil {
		b.bt = newBatch()
		b.items = b.bt.batch[:0]
	}
	b.items = append(b.items, it)
	b.bytes += len(it.rec.Payload)
	b.grant += g
	return nil
}

// grantFor is the compression buffer a small record needs (0: none, for codec none or an
// empty payload).
func (s *Session) grantFor(it *item) int64 {
	if s.codec == nil || len(it.rec.Payload) == 0 {
		return 0
	}
	return int64(bufCap(len(it.rec.Payload)))
}

// flush queues b's records as one element for the writer, compressed first (inline or by
// the pool), and empties b.
func (s *Session) flush(b *batch) error {
	if len(b.items) == 0 {
		return nil
	}
	bt := b.bt
	bt.kind, bt.batch, bt.done = kindBatch, b.items, make(chan struct{})
	*b = batch{}
	if s.codec == nil {
		// Written straight from the ring; the writer frees the spans afterwards.
		close(bt.done)
		return s.enqueue(bt)
	}
	var failed error
	for i, it := range bt.batch {
		if err := s.prepareSmall(it); err != nil {
			// The records before it are good and are written; it stops the writer, and
			// those after it were never dispatched.
			it.setErr(err)
			s.tail.freeAll(bt.batch[i+1:])
			bt.batch = bt.batch[:i+1]
			failed = err
			break
		}
	}
	if failed != nil {
		// Failed before the writer sees the record, so the session's error is this one.
		s.fail(failed)
	}
	if s.inline {
		s.compressBatch(bt, s.o.CPU != nil)
		if err := s.enqueue(bt); err != nil {
			return err
		}
	} else {
		if err := s.enqueue(bt); err != nil {
			return err
		}
		if err := s.o.Pool.Submit(s.ctx, func() { s.compressBatch(bt, false) }); err != nil {
			bt.setErr(err)
			s.tail.freeAll(bt.batch)
			close(bt.done)
			return s.fail(&Error{Kind: KindInternal, Err: fmt.Errorf("submit batch: %w", err)})
		}
	}
	return s.Err()
}

// prepareSmall readies a small record for compressBatch: its encoder and its buffer's
// memory grant (waited for, like dispatch's).
func (s *Session) prepareSmall(it *item) error {
	if len(it.rec.Payload) == 0 || it.coded != nil && it.coded.Blocks() == 0 {
		return nil
	}
	enc, se, withStats, err := s.encoderFor(it)
	if err != nil {
		return err
	}
	g, err := s.o.Lease.acquire(s.ctx, int64(bufCap(len(it.rec.Payload))))
	if err != nil {
		return &Error{Kind: KindInternal, Err: fmt.Errorf("wait for memory budget: %w", err)}
	}
	it.block1[0], it.grant1[0] = stream.Block{}, g
	it.blocks, it.grants = it.block1[:], it.grant1[:]
	if withStats {
		it.stats = make([]codec.BlockStats, 1)
	}
	it.enc, it.se, it.withStats = enc, se, withStats
	return nil
}

// compressBatch compresses every record of a batch (each one block), frees their ring
// bytes together and marks the batch done. lockThread keeps the goroutine on its thread
// meanwhile, so the CPU budget's thread clock measures this goroutine's work alone.
func (s *Session) compressBatch(bt *item, lockThread bool) {
	if lockThread {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	for _, it := range bt.batch {
		if it.blocks == nil || it.getErr() != nil {
			continue // empty payload, or not prepared
		}
		s.compressBlock(it, 0, it.rec.Payload, it.enc, it.se, it.withStats)
		it.enc, it.se = nil, nil
	}
	s.tail.freeAll(bt.batch)
	close(bt.done)
}
