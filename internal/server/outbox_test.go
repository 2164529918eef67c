package server

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/shm"
)

func seqpacketPair(t *testing.T) (daemon, client *control.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *control.Conn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return control.NewConn(c.(*net.UnixConn))
	}
	daemon, client = mk(fds[0]), mk(fds[1])
	t.Cleanup(func() { daemon.Close(); client.Close() })
	return daemon, client
}

func TestAppendRelease(t *testing.T) {
	for _, tail := range []uint64{0, 64, 4096, 1<<40 + 64, ^uint64(0)} {
		want, err := control.Encode(control.TypeRelease, control.Release{Tail: tail})
		if err != nil {
			t.Fatal(err)
		}
		if got := appendRelease([]byte("x"), tail); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Errorf("tail %d: %q, want %q", tail, got[1:], want)
		}
	}
}

// recvType reads one message: its type, and its tail when it is a RELEASE.
func recvType(t *testing.T, c *control.Conn) (control.Type, uint64) {
	t.Helper()
	_ = c.Unix().SetReadDeadline(time.Now().Add(5 * time.Second))
	m, _, err := c.Recv(0)
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != control.TypeRelease {
		return m.Type, 0
	}
	var r control.Release
	if err := m.Unmarshal(&r, "tail"); err != nil {
		t.Fatal(err)
	}
	return m.Type, r.Tail
}

// A RELEASE sent on the caller's goroutine never overtakes a message queued before it.
func TestOutboxInlineReleaseKeepsOrder(t *testing.T) {
	for i := range 200 {
		d, c := seqpacketPair(t)
		o := newOutbox(d, func(error) {})
		o.send(control.TypeCheckpointed, control.Checkpointed{Seq: uint64(i)})
		o.release(uint64(64 * (i + 1)))
		o.release(uint64(64 * (i + 2)))
		if typ, _ := recvType(t, c); typ != control.TypeCheckpointed {
			t.Fatalf("round %d: first message %s, want CHECKPOINTED", i, typ)
		}
		// Then the newest tail, possibly after the older one (coalescing is allowed).
		typ, tail := recvType(t, c)
		if typ == control.TypeRelease && tail == uint64(64*(i+1)) {
			typ, tail = recvType(t, c)
		}
		if typ != control.TypeRelease || tail != uint64(64*(i+2)) {
			t.Fatalf("round %d: got %s tail %d, want RELEASE %d", i, typ, tail, 64*(i+2))
		}
		o.stop()
	}
}

// With nothing queued the RELEASE is sent before release returns (no goroutine hop); on a
// full socket it is left to the goroutine, which sends the newest tail once the client
// reads.
func TestOutboxInlineReleaseFullSocket(t *testing.T) {
	d, c := seqpacketPair(t)
	o := newOutbox(d, func(error) {})
	defer o.stop()
	o.release(64)
	// Sent inline: done when release returned.
	o.mu.Lock()
	sent := o.tailSent
	o.mu.Unlock()
	if sent != 64 {
		t.Fatalf("tail sent %d when release returned, want 64", sent)
	}
	if typ, tail := recvType(t, c); typ != control.TypeRelease || tail != 64 {
		t.Fatalf("got %s %d, want RELEASE 64", typ, tail)
	}
	// Fill the daemon's send side until the inline send finds it full.
	n := uint64(128)
	for ; ; n += 64 {
		o.release(n)
		o.mu.Lock()
		behind := o.tailSent < o.tail
		o.mu.Unlock()
		if behind {
			break
		}
		if n > 1<<30 {
			t.Fatal("socket never filled")
		}
	}
	last := n + 64
	o.release(last)
	var got uint64
	for got != last {
		typ, tail := recvType(t, c)
		if typ != control.TypeRelease || tail < got {
			t.Fatalf("got %s %d after %d", typ, tail, got)
		}
		got = tail
	}
}

// While held, released tails wait for unhold and leave as one RELEASE, the newest; past
// holdMax bytes they go at once, as without hold.
func TestOutboxHoldCoalesces(t *testing.T) {
	d, c := seqpacketPair(t)
	o := newOutbox(d, func(error) {})
	defer o.stop()
	o.hold(1 << 20)
	for tail := uint64(64); tail <= 640; tail += 64 {
		o.release(tail)
	}
	_ = c.Unix().SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if m, _, err := c.Recv(0); err == nil {
		t.Fatalf("got %s while held", m.Type)
	}
	o.unhold()
	if typ, tail := recvType(t, c); typ != control.TypeRelease || tail != 640 {
		t.Fatalf("got %s %d, want RELEASE 640", typ, tail)
	}
	o.hold(1 << 20)
	o.release(640 + 1<<20) // a whole holdMax waits: sent now
	if typ, tail := recvType(t, c); typ != control.TypeRelease || tail != 640+1<<20 {
		t.Fatalf("got %s %d, want RELEASE %d", typ, tail, 640+1<<20)
	}
	o.unhold() // nothing newer: nothing more
	_ = c.Unix().SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if m, _, err := c.Recv(0); err == nil {
		t.Fatalf("got %s after unhold with nothing waiting", m.Type)
	}
}

// One PUBLISH of a decoding-sized window that the session writes in several batches gets
// one RELEASE (issue 38: one per batch before, and each woke strapd again when the client
// read it).
func TestOneReleasePerPublish(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+32<<20, outFile(t), control.Open{Codec: "none", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	for i := range 600 { // 2 KiB each: five batches of batchBytes
		tn := tensor(fmt.Sprintf("model.layers.%d.mlp", i%8), uint64(i+1), 512)
		if seq, err = st.P.Put(&tn); err != nil {
			t.Fatal(err)
		}
	}
	head := st.P.Head()
	if err := c.Publish(head, seq); err != nil {
		t.Fatal(err)
	}
	releases := 0
	var tail uint64
	for tail < head {
		var typ control.Type
		typ, tail = recvType(t, c.Conn())
		if typ != control.TypeRelease {
			t.Fatalf("got %s, want RELEASE", typ)
		}
		releases++
	}
	if releases != 1 {
		t.Fatalf("%d RELEASE messages for one PUBLISH, want 1", releases)
	}
	if err := st.P.Release(tail); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
}
