package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// stepEvents sends step k of a per-token capture: two tensors, then token k.
func stepEvents(t *testing.T, st *controltest.Stream, k int) {
	t.Helper()
	for j := range 2 {
		tn := tensor(fmt.Sprintf("model.layers.%d.mlp", j), uint64(10*k+j+1), 300)
		tn.Step, tn.Forward = uint64(k), uint64(k)
		if err := st.Put(&tn); err != nil {
			t.Fatal(err)
		}
	}
	seq := st.P.TakeSeq()
	if err := st.C.Token(control.Token{Seq: seq, Index: uint64(k), TokenID: int64(100 + k), Text: fmt.Sprintf("t%d", k)}); err != nil {
		t.Fatal(err)
	}
}

// packetsOf lists every packet of a stream but the INDEX, header fields and stored bytes.
func packetsOf(t *testing.T, path string) []string {
	t.Helper()
	r, f, err := stream.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := r.Scan(false)
	for sc.Next() {
		p := sc.Packet()
		if p.Type == stream.TypeIndex {
			continue
		}
		out = append(out, fmt.Sprintf("%v %s seq=%d step=%d fwd=%d meta=%s crc=%08x %x", p.Type, p.Name, p.Seq, p.Step,
			p.Forward, p.Meta, p.CRC, sc.Payload()))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCheckpointAndResumeThroughSocket: CHECKPOINTED describes exactly the durable prefix;
// after the client dies, a session opened with append_at continues it, and the result has
// the packets of an uninterrupted session.
func TestCheckpointAndResumeThroughSocket(t *testing.T) {
	ts := startServer(t, Config{})
	const steps, ckAt = 6, 3
	req := control.Open{Codec: "lz4", Policy: "block"}

	// Uninterrupted reference.
	c := ts.dial(t)
	ref := outFile(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+256<<10, ref, req)
	if err != nil {
		t.Fatal(err)
	}
	for k := range steps {
		stepEvents(t, st, k)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}

	// Checkpoint after step ckAt-1, two more steps, then the client dies.
	path := filepath.Join(t.TempDir(), "run.strap")
	out, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	c2 := ts.dial(t)
	st2, _, err := controltest.OpenStream(c2, shm.HeaderSize+256<<10, out, req)
	out.Close()
	if err != nil {
		t.Fatal(err)
	}
	for k := range ckAt {
		stepEvents(t, st2, k)
	}
	ck, err := c2.Checkpoint(st2.P.LastSeq())
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != int64(ck.Offset) {
		t.Fatalf("CHECKPOINTED offset %d, file holds %d bytes", ck.Offset, fi.Size())
	}
	if ck.Packets != 3*ckAt || ck.Tokens != ckAt || ck.Seq != 3*ckAt || ck.LastCRC == 0 || ck.LastOffset == 0 {
		t.Fatalf("CHECKPOINTED %+v", ck)
	}
	if ss := ts.srv.Status().Sessions; len(ss) != 1 || ss[0].Checkpoints != 1 || ss[0].Tokens != ckAt ||
		ss[0].LastCheckpointAgeS < 0 {
		t.Fatalf("status %+v", ss)
	}
	stepEvents(t, st2, ckAt)
	stepEvents(t, st2, ckAt+1)
	st2.P.Close()
	c2.Disconnect()
	waitFor(t, func() bool { return len(ts.srv.Status().Sessions) == 0 })

	expect := control.Resume{LastSeq: ck.Seq, LastCRC: ck.LastCRC, Packets: ck.Packets}
	for _, tc := range []struct {
		name   string
		at     uint64
		resume *control.Resume
		flags  int
		want   string
	}{
		{"crc", ck.Offset, &control.Resume{LastSeq: ck.Seq, LastCRC: ck.LastCRC + 1, Packets: ck.Packets}, os.O_RDWR, "crc"},
		{"mid-packet", ck.Offset - 9, &expect, os.O_RDWR, "packet boundary"},
		{"no resume body", ck.Offset, nil, os.O_RDWR, "without resume"},
		{"write-only", ck.Offset, &expect, os.O_WRONLY, "O_RDWR without O_TRUNC to resume"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.OpenFile(path, tc.flags, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			before, _ := os.ReadFile(path)
			c := ts.dial(t)
			r := req
			r.AppendAt, r.Resume = tc.at, tc.resume
			_, _, err = controltest.OpenStream(c, shm.HeaderSize+256<<10, f, r)
			var ce *control.Error
			if !errors.As(err, &ce) || !strings.Contains(ce.Message, tc.want) {
				t.Fatalf("OPEN = %v, want an error about %q", err, tc.want)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Fatal("a refused resume changed the stream")
			}
		})
	}

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c3 := ts.dial(t)
	r := req
	r.AppendAt, r.Resume = ck.Offset, &expect
	st3, _, err := controltest.OpenStream(c3, shm.HeaderSize+256<<10, f, r)
	if err != nil {
		t.Fatal(err)
	}
	for range ck.Seq {
		st3.P.TakeSeq() // the producer numbers on from the checkpoint
	}
	if ss := ts.srv.Status().Sessions; len(ss) != 1 || ss[0].Resumed != ck.Offset || ss[0].Tokens != ckAt {
		t.Fatalf("status of the resumed session %+v", ss)
	}
	for k := ckAt; k < steps; k++ {
		stepEvents(t, st3, k)
	}
	cl, err := st3.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if cl.Packets != 3*steps {
		t.Fatalf("CLOSED %+v", cl)
	}
	want, got := packetsOf(t, ref.Name()), packetsOf(t, path)
	if len(got) != len(want) {
		t.Fatalf("%d packets, uninterrupted %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("packet %d:\n got %.200s\nwant %.200s", i, got[i], want[i])
		}
	}
	if rep, err := stream.VerifyFile(path); err != nil || !rep.OK {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// TestCheckpointMustCoverEverything: CHECKPOINT for a seq other than the last one sent is a
// fatal torn_record (a checkpoint would otherwise describe a prefix without them).
func TestCheckpointMustCoverEverything(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, outFile(t), control.Open{Codec: "none", Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	stepEvents(t, st, 0)
	_, err = c.Checkpoint(st.P.LastSeq() - 1)
	var ce *control.Error
	if !errors.As(err, &ce) || ce.Code != control.CodeTornRecord || !strings.Contains(ce.Message, "checkpoint seq 2") {
		t.Fatalf("CHECKPOINT of an old seq = %v, want torn_record", err)
	}
}

// TestResumeRefusesCompleteStream: an OPEN whose append_at lies before the END of a capture
// that finished (a stale checkpoint beside a complete stream, or a client that does not
// check) is refused bad_output, and the stream keeps every byte (issue 41: such a resume
// cut a finished capture).
func TestResumeRefusesCompleteStream(t *testing.T) {
	ts := startServer(t, Config{})
	req := control.Open{Codec: "lz4", Policy: "block"}
	path := filepath.Join(t.TempDir(), "done.strap")
	out, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	c := ts.dial(t)
	st, _, err := controltest.OpenStream(c, shm.HeaderSize+256<<10, out, req)
	out.Close()
	if err != nil {
		t.Fatal(err)
	}
	stepEvents(t, st, 0)
	ck, err := c.Checkpoint(st.P.LastSeq())
	if err != nil {
		t.Fatal(err)
	}
	stepEvents(t, st, 1)
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := req
	r.AppendAt, r.Resume = ck.Offset, &control.Resume{LastSeq: ck.Seq, LastCRC: ck.LastCRC, Packets: ck.Packets}
	_, _, err = controltest.OpenStream(ts.dial(t), shm.HeaderSize+256<<10, f, r)
	var ce *control.Error
	if !errors.As(err, &ce) || ce.Code != control.CodeBadOutput || !strings.Contains(ce.Message, "END (complete)") ||
		!strings.Contains(ce.Message, fmt.Sprintf("would cut %d bytes", int64(len(before))-int64(ck.Offset))) {
		t.Fatalf("OPEN resuming a complete stream = %v, want bad_output naming the END and the bytes", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatalf("a refused resume changed the complete stream: %d bytes, were %d", len(after), len(before))
	}
}
