package server

import (
	"errors"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
)

// maxQueued bounds the messages waiting for a client that does not read; past it the
// connection's replies are dropped (RELEASE never queues: only the newest tail is kept).
// A fatal ERROR is still queued: it is the last message of the connection, so it cannot
// grow the queue further, and the client must learn why it was cut off.
const maxQueued = 256

// outbox sends messages to one client from its own goroutine, so the daemon never blocks
// on a client that does not read. RELEASE tails are coalesced: only the newest is sent.
//
// A RELEASE is sent at once by whoever frees the ring bytes when nothing else is queued
// or being sent: one non-blocking send(2), made as a raw syscall, instead of waking the
// sender goroutine (a goroutine hand-off, often an OS thread woken, per decoding step:
// PERFORMANCE.md, "One wake-up per token"). A full socket leaves it to the goroutine.
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
	// held defers RELEASE while the connection handles a message (hold, unhold): the tails
	// its batches free go out as one RELEASE when it is done, unless holdMax bytes or more
	// wait. Each RELEASE the client reads wakes strapd once more (the socket's writable
	// edge in the Go poller): a decoding PUBLISH freed its window in two or three batches,
	// so three RELEASEs and three such wake-ups (issue 38).
	held    bool
	holdMax uint64
	wake    chan struct{}
	done    chan struct{}
	onDead  func(error)
	// rc is the socket's raw access for the inline RELEASE (nil: always the goroutine).
	rc   syscall.RawConn
	rbuf []byte // the inline RELEASE's encoding, reused
}

func newOutbox(c *control.Conn, onDead func(error)) *outbox {
	o := &outbox{wake: make(chan struct{}, 1), done: make(chan struct{}), onDead: onDead}
	o.cond = sync.NewCond(&o.mu)
	if rc, err := c.Unix().SyscallConn(); err == nil {
		o.rc = rc
	}
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

// release records a new tail; it never blocks. With nothing else queued or being sent it
// sends the RELEASE itself (see outbox).
func (o *outbox) release(tail uint64) {
	o.mu.Lock()
	if tail > o.tail {
		o.tail = tail
	}
	if o.held && o.tail-o.tailSent < o.holdMax {
		o.mu.Unlock() // unhold sends it
		return
	}
	if o.tail > o.tailSent && o.rc != nil && len(o.q) == 0 && !o.sending && !o.dead && !o.stopped && !o.muted {
		o.rbuf = appendRelease(o.rbuf[:0], o.tail)
		err := trySend(o.rc, o.rbuf)
		switch {
		case err == nil:
			o.tailSent = o.tail
			o.mu.Unlock()
			return
		case errors.Is(err, unix.EAGAIN):
			// The client is not reading: the goroutine waits for room.
		default:
			o.dead = true
			o.cond.Broadcast()
			o.mu.Unlock()
			o.onDead(err)
			o.signal() // the goroutine sees dead and ends
			return
		}
	}
	o.mu.Unlock()
	o.signal()
}

// hold defers RELEASE until unhold while fewer than max bytes wait (0: no deferral).
// Only the connection's goroutine calls hold and unhold, around one message.
func (o *outbox) hold(max uint64) {
	o.mu.Lock()
	o.held, o.holdMax = max > 0, max
	o.mu.Unlock()
}

// unhold ends hold and sends the newest tail, if one waits, as release would.
func (o *outbox) unhold() {
	o.mu.Lock()
	held := o.held
	o.held = false
	o.mu.Unlock()
	if held {
		o.release(0)
	}
}

// appendRelease appends a framed RELEASE {"tail":tail}, byte for byte what
// control.Encode makes of control.Release (TestAppendRelease), without reflection.
func appendRelease(b []byte, tail uint64) []byte {
	body := strconv.AppendUint([]byte(`{"tail":`), tail, 10)
	body = append(body, '}')
	framed, err := control.EncodeRaw(control.Version, control.TypeRelease, body)
	if err != nil {
		panic(err) // a few dozen bytes: cannot exceed MaxMessage
	}
	return append(b, framed...)
}

// trySend sends one datagram without blocking and without entering the Go scheduler's
// syscall state (a raw send(2) with MSG_DONTWAIT): unix.EAGAIN when the socket is full.
func trySend(rc syscall.RawConn, b []byte) error {
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		for {
			_, _, errno = unix.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
				uintptr(unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL), 0, 0)
			if errno != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
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
	if o.held { // a handler that ends the connection: what it held goes now
		o.held = false
		o.mu.Unlock()
		o.release(0)
		o.mu.Lock()
	}
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
