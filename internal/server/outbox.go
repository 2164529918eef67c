package server

import (
	"sync"
	"time"

	"github.com/strap-llm/strap/internal/control"
)

// maxQueued bounds the messages waiting for a client that does not read; past it the
// connection's replies are dropped (RELEASE never queues: only the newest tail is kept).
// A fatal ERROR is still queued: it is the last message of the connection, so it cannot
// grow the queue further, and the client must learn why it was cut off.
const maxQueued = 256

// outbox sends messages to one client from its own goroutine, so the daemon never blocks
// on a client that does not read. RELEASE tails are coalesced: only the newest is sent.
type outbox struct {
	mu       sync.Mutex
	cond     *sync.Cond
	q        [][]byte
	tail     uint64
	tailSent uint64
	dead     bool // the socket failed
	muted    bool // the queue overflowed: replies are dropped, a fatal ERROR is not
	sending  bool // a message is being written
	stopped  bool
	wake     chan struct{}
	done     chan struct{}
	onDead   func(error)
}

func newOutbox(c *control.Conn, onDead func(error)) *outbox {
	o := &outbox{wake: make(chan struct{}, 1), done: make(chan struct{}), onDead: onDead}
	o.cond = sync.NewCond(&o.mu)
	go o.run(c)
	return o
}

func (o *outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// send queues one message.
func (o *outbox) send(t control.Type, body any) {
	b, err := control.Encode(t, body)
	if err != nil {
		// Bodies are daemon-built structs; a failure here is a programming error.
		panic(err)
	}
	e, isErr := body.(control.Error)
	fatal := t == control.TypeError && isErr && e.Fatal
	o.mu.Lock()
	if o.dead || o.stopped || (o.muted && !fatal) {
		o.mu.Unlock()
		return
	}
	if len(o.q) >= maxQueued && !fatal {
		o.muted = true
		o.mu.Unlock()
		o.onDead(errQueueFull)
		return
	}
	o.q = append(o.q, b)
	o.mu.Unlock()
	o.signal()
}

// release records a new tail; it never blocks.
func (o *outbox) release(tail uint64) {
	o.mu.Lock()
	if tail > o.tail {
		o.tail = tail
	}
	o.mu.Unlock()
	o.signal()
}

func (o *outbox) run(c *control.Conn) {
	defer close(o.done)
	for range o.wake {
		for {
			o.mu.Lock()
			if o.dead {
				o.cond.Broadcast()
				o.mu.Unlock()
				return
			}
			var b []byte
			switch {
			case len(o.q) > 0:
				b = o.q[0]
				o.q = o.q[1:]
			case o.tail > o.tailSent:
				b, _ = control.Encode(control.TypeRelease, control.Release{Tail: o.tail})
				o.tailSent = o.tail
			}
			if b == nil {
				o.cond.Broadcast()
				stopped := o.stopped
				o.mu.Unlock()
				if stopped {
					return
				}
				break
			}
			o.sending = true
			o.mu.Unlock()
			err := c.SendRaw(b)
			o.mu.Lock()
			o.sending = false
			if err != nil {
				o.dead = true
			}
			o.cond.Broadcast()
			o.mu.Unlock()
			if err != nil {
				o.onDead(err)
				return
			}
		}
	}
}

// flush waits until everything queued is sent, the client is dead, or timeout passes.
func (o *outbox) flush(timeout time.Duration) {
	t := time.AfterFunc(timeout, func() {
		o.mu.Lock()
		o.dead = true
		o.cond.Broadcast()
		o.mu.Unlock()
	})
	defer t.Stop()
	o.mu.Lock()
	for !o.dead && (o.sending || len(o.q) > 0 || o.tail > o.tailSent) {
		o.cond.Wait()
	}
	o.mu.Unlock()
}

// stop ends the sender goroutine once idle; call after the socket is closed or flushed.
func (o *outbox) stop() {
	o.mu.Lock()
	o.stopped = true
	o.mu.Unlock()
	o.signal()
	<-o.done
}
