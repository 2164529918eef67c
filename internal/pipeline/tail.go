package pipeline

import (
	"sync"
	"sync/atomic"
)

// tailTracker gives ring space back in ring order. Records finish out of order (blocks
// compress in parallel, notices need no compression), but the client can reuse bytes only
// up to the first record still in use, so the tail advances over contiguous freed spans.
type tailTracker struct {
	release func(tail uint64) // called with each new tail, outside the lock

	mu    sync.Mutex
	spans []*span
	tail  uint64
	// pos mirrors tail for Stats without the lock.
	pos atomic.Uint64
}

// span is one record's ring range in the tail tracker.
type span struct {
	end   uint64
	freed bool
}

// add records the next record's range, ending at end; records arrive in ring order.
func (t *tailTracker) add(end uint64) *span { return t.addTo(&span{}, end) }

// addTo is add with the caller's span (an item's own, which saves an allocation per
// record).
func (t *tailTracker) addTo(sp *span, end uint64) *span {
	*sp = span{end: end}
	t.mu.Lock()
	t.spans = append(t.spans, sp)
	t.mu.Unlock()
	return sp
}

// current is the tail now.
func (t *tailTracker) current() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tail
}

// free marks a span's ring bytes as no longer needed and advances the tail past every
// contiguous freed span.
func (t *tailTracker) free(sp *span) {
	t.mu.Lock()
	sp.freed = true
	t.advance()
}

// freeAll frees the spans of items (those that hold one) under one lock, so that the
// client is told the new tail once.
func (t *tailTracker) freeAll(items []*item) {
	t.mu.Lock()
	for _, it := range items {
		if it.span != nil {
			it.span.freed = true
		}
	}
	t.advance()
}

// advance moves the tail past every contiguous freed span and reports a new tail; t.mu is
// held on entry and released.
func (t *tailTracker) advance() {
	old := t.tail
	i := 0
	for i < len(t.spans) && t.spans[i].freed {
		t.tail = t.spans[i].end
		i++
	}
	if i > 0 {
		clear(t.spans[:i])
		if i == len(t.spans) {
			// All freed (a decoding step's window, usually): keep the array, or every
			// record's append would soon grow a new one.
			t.spans = t.spans[:0]
		} else {
			t.spans = t.spans[i:]
		}
	}
	tail := t.tail
	t.mu.Unlock()
	if tail != old {
		t.pos.Store(tail)
		t.release(tail)
	}
}
