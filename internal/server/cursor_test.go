package server

import (
	"testing"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/shm"
)

// The published cursor (PROTOCOL.md 1.4, 2): a client that dies after storing it loses
// none of the records below it, even those no PUBLISH named.

// cursorSession opens a session with a ring big enough that nothing wraps and streams
// published tensors through it; it returns the stream and what was sent.
func cursorSession(t *testing.T, ts *testServer, published int) (*controltest.Stream, *control.Client, []shm.Tensor, string) {
	t.Helper()
	c := ts.dial(t)
	out := outFile(t)
	st, o, err := controltest.OpenStream(c, shm.HeaderSize+1<<20, out, control.Open{Codec: "lz4", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.PublishedCursor {
		t.Fatalf("OPENED %+v does not offer the published cursor", o)
	}
	var sent []shm.Tensor
	for i := range published {
		tn := tensor("pub", uint64(i+1), 300)
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, tn)
	}
	return st, c, sent, out.Name()
}

// put writes a tensor into the ring without publishing it and returns its position.
func put(t *testing.T, p *shm.Producer, tn *shm.Tensor) uint64 {
	t.Helper()
	pos := p.Head()
	if _, err := p.Put(tn); err != nil {
		t.Fatal(err)
	}
	return pos
}

func TestClientDeathTakesRecordsBelowCursor(t *testing.T) {
	ts := startServer(t, Config{})
	st, c, sent, path := cursorSession(t, ts, 3)
	for i := range 4 {
		tn := tensor("deferred", uint64(10+i), 200)
		put(t, st.P, &tn)
		sent = append(sent, tn)
	}
	st.P.SetPublished(st.P.Head())
	// Beyond the cursor: being written when the client died, never taken.
	beyond := tensor("beyond", 99, 50)
	put(t, st.P, &beyond)
	c.Disconnect()
	waitFor(t, func() bool { return ts.srv.Status().Daemon.Sessions == 0 })
	s := checkStream(t, path, sent, "aborted")
	if s.End.Meta["packets"] != float64(7) {
		t.Fatalf("END %v", s.End.Meta)
	}
}

func TestCursorDrainStopsAtTornRecord(t *testing.T) {
	ts := startServer(t, Config{})
	st, c, sent, path := cursorSession(t, ts, 2)
	good := tensor("deferred", 10, 200)
	put(t, st.P, &good)
	sent = append(sent, good)
	torn := tensor("torn", 11, 200)
	pos := put(t, st.P, &torn)
	after := tensor("after", 12, 200)
	put(t, st.P, &after)
	// The torn record's magic is overwritten: a broken client, since every record below
	// the cursor must be complete. The drain keeps what came before it and stops there.
	copy(st.P.Mem()[shm.HeaderSize+pos%st.P.DataSize():], "XXXX")
	st.P.SetPublished(st.P.Head())
	c.Disconnect()
	waitFor(t, func() bool { return ts.srv.Status().Daemon.Sessions == 0 })
	checkStream(t, path, sent, "aborted")
}

func TestCursorOutsideWindowRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cur  func(p *shm.Producer) uint64
	}{
		// past data_size from any tail the daemon can have (its tail is at most the head; the
		// producer's own Tail lags the RELEASEs still in flight, which made this racy)
		{"past data_size", func(p *shm.Producer) uint64 { return p.Head() + p.DataSize() + shm.Align }},
		{"far past", func(*shm.Producer) uint64 { return ^uint64(0) &^ (shm.Align - 1) }},
		{"misaligned", func(p *shm.Producer) uint64 { return p.Head() - 1 }},
		{"behind the head", func(*shm.Producer) uint64 { return shm.Align }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Config{})
			st, c, sent, path := cursorSession(t, ts, 3)
			unpub := tensor("unpublished", 50, 100)
			put(t, st.P, &unpub)
			st.P.SetPublished(tc.cur(st.P))
			c.Disconnect()
			waitFor(t, func() bool { return ts.srv.Status().Daemon.Sessions == 0 })
			checkStream(t, path, sent, "aborted")
		})
	}
}

func TestTokenCarriesHead(t *testing.T) {
	ts := startServer(t, Config{})
	st, c, sent, path := cursorSession(t, ts, 1)
	var seq uint64 = 1
	for i := range 3 {
		tn := tensor("fwd", uint64(20+i), 200)
		put(t, st.P, &tn)
		seq++
		sent = append(sent, tn)
		head := st.P.Head()
		seq++
		if err := c.Conn().Send(control.TypeToken, control.Token{Seq: seq, Index: uint64(i), TokenID: int64(i), Text: "x",
			Head: &head}); err != nil {
			t.Fatal(err)
		}
		if st.P.TakeSeq() != seq {
			t.Fatal("producer seq out of step")
		}
	}
	if _, err := c.Close(control.Close{Seq: seq, Head: st.P.Head()}); err != nil {
		t.Fatal(err)
	}
	s := checkStream(t, path, sent, "complete")
	if len(s.Packets) != 7 {
		t.Fatalf("%d packets, want 4 tensors and 3 tokens", len(s.Packets))
	}
}

func TestTokenHeadWithWrongSeqIsTorn(t *testing.T) {
	ts := startServer(t, Config{})
	st, c, _, _ := cursorSession(t, ts, 1)
	tn := tensor("fwd", 20, 200)
	put(t, st.P, &tn) // seq 2
	head := st.P.Head()
	// The token claims seq 4: the window would have to end with seq 3.
	if err := c.Conn().Send(control.TypeToken, control.Token{Seq: 4, Index: 0, Text: "x", Head: &head}); err != nil {
		t.Fatal(err)
	}
	_, err := c.WaitRelease(1 << 40)
	e, ok := err.(*control.Error)
	if !ok || e.Code != "torn_record" {
		t.Fatalf("err = %v, want torn_record", err)
	}
}
