package server

import (
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline"
	"github.com/strap-llm/strap/internal/upload"
)

// openFDs names the descriptors carried with OPEN (docs/PROTOCOL.md 1.3), in their order on
// the wire: the ring and the output always, then the optional trace, then the resource log
// (always the last descriptor) when the body says "resources": true. An absent one is -1.
type openFDs struct {
	ring        int // the sealed memfd ring (1.3 item 1)
	output      int // the stream file (item 2)
	trace       int // the trace file (item 3), -1 when none
	resourceLog int // the resource log (item 4), -1 when none
}

// namedOpenFDs maps OPEN's descriptors to their roles, or says why their number does not
// fit the body.
func namedOpenFDs(fds []int, resources bool) (openFDs, error) {
	o := openFDs{trace: -1, resourceLog: -1}
	if len(fds) < 2 || len(fds) > 4 {
		return o, perr(control.CodeBadMessage, "OPEN carries %d file descriptors, expected 2 to 4 (ring memfd, output file, optional trace file, resource log when \"resources\": true)", len(fds))
	}
	o.ring, o.output = fds[0], fds[1]
	rest := fds[2:]
	if resources {
		if len(rest) == 0 {
			return o, perr(control.CodeBadMessage, "OPEN with \"resources\": true carries %d file descriptors, expected 3 or 4 (ring memfd, output file, optional trace file, resource log)", len(fds))
		}
		o.resourceLog, rest = rest[len(rest)-1], rest[:len(rest)-1]
	} else if len(rest) == 2 {
		return o, perr(control.CodeBadMessage, "OPEN carries 4 file descriptors without \"resources\": true, expected 2 or 3 (ring memfd, output file, optional trace file)")
	}
	if len(rest) == 1 {
		o.trace = rest[0]
	}
	return o, nil
}

// sides are the trace and the resource log that were passed, in that order: the files that
// go beside the stream's object when it is uploaded.
func (o openFDs) sides() []int {
	var out []int
	for _, fd := range []int{o.trace, o.resourceLog} {
		if fd >= 0 {
			out = append(out, fd)
		}
	}
	return out
}

// open validates OPEN and its descriptors, counts the session against the quotas and
// starts it. The descriptors are always closed (the ring stays mapped; the output is kept
// open as an *os.File until finish).
func (c *conn) open(m control.Message, fds []int) (err error) {
	defer func() {
		if err != nil {
			closeFDs(fds)
		}
	}()
	var req control.Open
	if err := m.Unmarshal(&req, control.OpenRequired...); err != nil {
		return control.Errorf(control.CodeBadMessage, "%w", err)
	}
	fd, err := namedOpenFDs(fds, req.Resources)
	if err != nil {
		return err
	}
	if fd.resourceLog >= 0 {
		if err := checkResourceLog(fd.resourceLog); err != nil {
			return err
		}
	}
	cfg := &c.srv.cfg
	if req.RingSize > cfg.MaxRingSize {
		return perr(control.CodeLimit, "ring_size %d exceeds this daemon's maximum %d (--max-ring-size)", req.RingSize, cfg.MaxRingSize)
	}
	plan, err := pipeline.Prepare(sessionRequest(req, c.cred))
	if err != nil {
		return err
	}
	rank, err := sessionRank(req.Metadata)
	if err != nil {
		return err
	}
	if bs := plan.BlockSize(); bs < 4096 || bs > cfg.MaxBlockSize {
		return perr(control.CodeLimit, "block_size %d, expected 4096..%d", bs, cfg.MaxBlockSize)
	}
	if err := checkOutput(fd.output, req.AppendAt != 0); err != nil {
		return err
	}
	if err := c.srv.checkTrace(fd.trace); err != nil {
		return err
	}
	if err := c.srv.quotas.openSession(cfg.Clients, c.cred.Uid); err != nil {
		return control.Errorf(control.CodeLimit, "%w", err)
	}
	id, ok := c.srv.takeSessionSlot()
	if !ok {
		c.srv.quotas.closeSession(c.cred.Uid)
		return perr(control.CodeLimit, "%d sessions already open (--max-sessions)", cfg.MaxSessions)
	}
	defer func() {
		if err != nil {
			c.srv.dropSessionSlot()
			c.srv.quotas.closeSession(c.cred.Uid)
		}
	}()
	outputLabel, _ := req.Metadata["output_path"].(string)
	outID, err := c.srv.claimOutput(fd.output, outputHolder{session: id, pid: c.cred.Pid, path: outputLabel})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			c.srv.releaseOutput(outID, id)
		}
	}()
	// The trace and the resource log, when passed, go beside the stream's object.
	up, err := c.beginUpload(req, fd.output, fd.sides(), id)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			up.abandon()
		}
	}()
	env := pipeline.Env{}
	if up != nil {
		env.OnDurable = func(off uint64) { up.u.Durable(int64(off)) }
		env.DurableEvery = uint64(c.srv.cfg.Uploads.Manager.PartSize())
		env.CRCGrain = c.srv.cfg.Uploads.Manager.PartSize() // every part boundary is a multiple
		// Freeing the local stream behind the upload needs the checkpoints and the index
		// entries they cover; a resume of a freed prefix takes its entries from the journal.
		env.IndexAtCheckpoint = up.u.FreesLocal()
		plan.UseJournal(up.u.Journal())
	}
	log := c.log.With(zap.Uint64("session", id))
	out := os.NewFile(uintptr(fd.output), fmt.Sprintf("session-%d-output", id))
	// Open closes the ring descriptor and out owns the output's: on a failure from here on
	// only the trace and the resource log are left to close.
	fds = fd.sides()
	sess, err := plan.Open(pipeline.Env{ID: id, Version: cfg.Version, Limits: cfg.Limits, Pool: c.srv.pool,
		Budget: c.srv.budget, CPU: c.srv.cpu, Release: c.out.release, Log: log, WriteDelay: cfg.DebugWriteDelay, Observer: cfg.Observer,
		OnDurable: env.OnDurable, DurableEvery: env.DurableEvery, CRCGrain: env.CRCGrain,
		IndexAtCheckpoint: env.IndexAtCheckpoint,
		OnCheckpoint: func(d pipeline.Durable) {
			if env.IndexAtCheckpoint {
				up.u.Checkpointed(upload.Checkpoint{Offset: int64(d.Offset), Packets: d.Packets, Drops: d.Drops, Tokens: d.Tokens,
					LastSeq: d.LastSeq, LastOffset: int64(d.LastOffset), LastCRC: d.LastCRC, Index: d.Index})
			}
			c.out.send(control.TypeCheckpointed, control.Checkpointed{Seq: d.Seq, Offset: d.Offset, Packets: d.Packets,
				Drops: d.Drops, Tokens: d.Tokens, LastOffset: d.LastOffset, LastCRC: d.LastCRC})
		},
		OnError: func(err error) {
			e := wireError(err)
			if e.Code == control.CodeWrite {
				// strapd never sees the path; the client's label lets the message name the file.
				e.Message = fmt.Sprintf("stream %q: %s", outputLabel, e.Message)
			}
			c.out.send(control.TypeError, e)
			c.wake()
		},
	}, fd.ring, out)
	if err != nil {
		out.Close()
		if be, ok := errors.AsType[*pipeline.BudgetError](err); ok {
			return budgetRefusal(be, plan.FitRing(be.Free()))
		}
		return err
	}
	var res *resourceLog
	if fd.resourceLog >= 0 {
		res = newResourceLog(fd.resourceLog, id, log)
	}
	var trace *os.File
	if fd.trace >= 0 {
		trace = os.NewFile(uintptr(fd.trace), fmt.Sprintf("session-%d-trace", id))
	}
	fds = nil
	str := func(k string) string { s, _ := req.Metadata[k].(string); return s }
	c.holdMax = req.RingSize / 8
	c.mu.Lock()
	c.sess = sess
	c.res = res
	c.upload = up
	c.slotted = true
	c.info = control.SessionStatus{Session: id, PID: c.cred.Pid, UID: c.cred.Uid, ModelClass: str("model_class"),
		OutputPath: str("output_path"), Codec: plan.Codec(), Policy: req.Policy, Started: time.Now().UTC().Format(time.RFC3339),
		RingSize: req.RingSize, Resumed: req.AppendAt, ResourceLog: res != nil, Distributed: rank}
	c.rates.start(time.Now(), sess.Stats())
	// The output file stays open for the session's life; finish closes it.
	c.outFile = out
	c.outID = outID
	c.mu.Unlock()
	c.srv.probeSessionStart(id, c.info.OutputPath, int(c.cred.Pid), trace)
	log.Info("session opened", zap.String("codec", plan.Codec()), zap.Uint64("ring_size", req.RingSize),
		zap.String("policy", req.Policy), zap.String("output_path", c.info.OutputPath),
		zap.Int64("memory_budget", sess.MemoryBudget()))
	if up != nil {
		if r := sess.RangeCRCs(); r != nil {
			up.u.UseCRCs(r)
		}
		if req.AppendAt > 0 {
			// The resumed prefix was checked by Open: it is durable and may go.
			up.u.Durable(int64(req.AppendAt))
		}
		log.Info("uploading", zap.String("object", up.u.Status().Object))
	}
	opened := control.Opened{Session: id, BlockSize: plan.BlockSize(), PublishedCursor: true, RingTokens: true}
	if up != nil {
		opened.Upload = up.u.Status().Object
	}
	c.out.send(control.TypeOpened, opened)
	return nil
}

// budgetRefusal is the memory_budget ERROR of an OPEN refused for want of budget: it says
// how large a ring would have fitted (fits_ring_size: smaller than the refused ring, so
// within --max-ring-size too), so that a client that chose its ring size itself can retry
// with a smaller one.
func budgetRefusal(be *pipeline.BudgetError, fits uint64) *control.Error {
	room := "no ring fits now"
	if fits > 0 {
		room = fmt.Sprintf("a ring of at most %d bytes fits now", fits)
	}
	return &control.Error{Code: control.CodeMemoryBudget, Fatal: true, FitsRingSize: &fits,
		Message: fmt.Sprintf("%v; %s (%s)", be, room, wireCodes[pipeline.KindMemoryBudget].flag)}
}

// sessionRequest is OPEN in the pipeline's terms, with the peer as the kernel reported it.
func sessionRequest(req control.Open, cred unix.Ucred) pipeline.Request {
	r := pipeline.Request{RingSize: req.RingSize, Codec: req.Codec, CodecLevel: req.CodecLevel,
		BlockSize: req.BlockSize, Policy: req.Policy, MemoryHint: req.MemoryHint, AppendAt: req.AppendAt,
		ClientMetadata: req.Metadata, Peer: pipeline.Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}}
	if req.Lossy != nil {
		r.Lossy = &codec.LossyBound{Mode: req.Lossy.Mode, Value: req.Lossy.Value}
	}
	if req.Resume != nil {
		r.Resume = &pipeline.ResumePoint{LastSeq: req.Resume.LastSeq, LastCRC: req.Resume.LastCRC, Packets: req.Resume.Packets}
	}
	return r
}

// checkOutput verifies the output descriptor is a regular file open for writing, without
// O_APPEND (the stream is written at explicit offsets from 0); a resume (append_at) also
// reads the prefix back, so it needs O_RDWR.
func checkOutput(fd int, resume bool) error {
	const how = "open it O_WRONLY|O_CREAT|O_TRUNC for a new capture, O_RDWR without O_TRUNC to resume"
	fl, err := checkWritableFile(fd, "output", how)
	if err != nil {
		return err
	}
	if resume && fl&unix.O_ACCMODE != unix.O_RDWR {
		return perr(control.CodeBadOutput, "output is open O_WRONLY, but append_at resumes it and strapd reads the prefix back (%s)", how)
	}
	if fl&unix.O_APPEND != 0 {
		return perr(control.CodeBadOutput, "output is open with O_APPEND (%s)", how)
	}
	return nil
}
