package upload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/crc32c"
	"github.com/strap-llm/strap/internal/stream"
	"golang.org/x/sys/unix"
)

// Upload states, as status shows them.
const (
	// StateUploading: parts go as the capture makes bytes durable.
	StateUploading = "uploading"
	// StateRetrying: the last attempt failed; the next waits for its backoff.
	StateRetrying = "retrying"
	// StateComplete: the object is complete and verified (and the side files beside it).
	StateComplete = "complete"
	// StateStopped: strapd stopped before the upload was complete; its state file is kept.
	StateStopped = "stopped"
	// StateWaiting: strapd stopped while the capture was written; the upload goes on
	// when the capture resumes (a pending upload a restarted strapd found).
	StateWaiting = "waiting"
	// StateLost: bytes the local disk no longer holds (freed) are missing on the server;
	// the object cannot be completed (Status.Lost names them).
	StateLost = "lost"
	// StateStalled: the server has not answered the upload's requests for longer than
	// the calls' floor (ClientOptions.Timeout): a server that hangs; the calls time out
	// and are retried (LastError names the last).
	StateStalled = "stalled"
	// StateRefused: the object key holds another capture's object, which strapd does not
	// overwrite (ErrKeyTaken); nothing was written, the local files are kept.
	StateRefused = "refused"
)

// Status is one upload as `strapd status` and /metrics show it: the wire type
// control.UploadStatus itself (STATUS_REPLY's "uploads"), so the uploader fills the very
// value the daemon sends and the two cannot drift apart.
type Status = control.UploadStatus

// SideFile is a file the session wrote beside the stream (trace, resource log), uploaded
// whole once the stream's object is complete.
type SideFile struct {
	// File reads it (the upload closes it).
	File *os.File
	// Path is its path (its base name names the object).
	Path string
}

// Upload is the upload of one stream file.
type Upload struct {
	m       *Manager
	st      *State // owned by run
	f       *os.File
	session uint64
	ctx     context.Context
	cancel  context.CancelFunc
	durable atomic.Int64
	wake    chan struct{}
	// finishSig tells a backoff wait that Finish was called.
	finishSig chan struct{}
	// reconcile: compare the state's parts with the server's before going on.
	reconcile bool
	// completed are the parts of the object once CompleteMultipartUpload succeeded (the
	// upload goroutine's): a retry verifies it rather than sending parts again.
	completed []Part
	// heard: the server answered this process's CompleteMultipartUpload of completed (or
	// the object was verified as one not heard, read back where it keeps no checksum).
	heard bool
	// verifiedHow is what that verification checked, when it was the one of an object
	// not heard completed (the status says it rather than the later, lighter check).
	verifiedHow string

	mu        sync.Mutex
	finalReq  int64 // -1 until Finish
	sidesReq  []SideFile
	staleReq  []string // RemoveBeside's names
	keepReq   bool     // KeepLocal was called
	sides     []*os.File
	crcs      CRCSource // the writer's record of the file's CRCs (UseCRCs); nil: read back
	status    Status
	done      bool
	finishedC chan struct{}

	// Freeing the local stream (free.go). Under mu: the checkpoints not yet journaled, and
	// the last two checkpoints' offsets and last packets' offsets.
	pending        []Checkpoint
	pendingEntries int
	freeStopped    bool // stopFreeing was called
	ckpts          []int64
	lastOffs       []int64
	// punch is a writable descriptor of the stream for fallocate (nil: none, or closed
	// once the session ended: it shares the client's lock on the file).
	punchMu sync.Mutex
	punch   *os.File
	// The upload goroutine's: the journal loaded for a resume, where the journal file
	// ends, the stream's header end and the first offset that may be freed (its 4 KiB
	// multiple), whether freeing stopped, and whether the server's copies of parts can be
	// checked (copyPart).
	freeLocal  bool // set by Begin
	journal    *stream.Journal
	journalEnd int64
	hdrEnd     int64
	dataOff    int64
	noFree     bool
	// noCopy: the server's copies of parts cannot be checked (copyPart; its goroutines
	// share it); copyTried: one was tried.
	noCopy    atomic.Bool
	copyTried bool

	// track says since when the upload waits for an answer from the server (stalled).
	track *tracker
	// saveMu orders the state file's writes: the goroutine's (save) and Finish's, which
	// records the stream's end at once from saved, the last bytes written.
	saveMu sync.Mutex
	saved  []byte
	// finSides are the side files' records, made by Finish with sidesReq.
	finSides []Side
	// overwrite: this upload completed the object at its key, which then did not verify
	// (replaced, damaged): it is sent anew over whatever the key holds, without the check
	// that keeps other captures' objects (claim).
	overwrite bool
}

func (m *Manager) newUpload(st *State, f *os.File, session uint64) *Upload {
	u := &Upload{m: m, st: st, f: f, session: session, wake: make(chan struct{}, 1), finishSig: make(chan struct{}, 1),
		finalReq: -1, finishedC: make(chan struct{}), track: &tracker{}}
	u.saved, _ = json.Marshal(st)
	u.ctx, u.cancel = context.WithCancel(withTracker(m.ctx, u.track))
	u.status = st.status(StateUploading)
	u.status.Session = session
	u.wakeUp()
	return u
}

func (s *State) uploaded() int64 {
	if len(s.Parts) == 0 {
		return 0
	}
	last := s.Parts[len(s.Parts)-1]
	return partStart(s.PartSize, last.Number) + last.Size
}

func (u *Upload) object() string { return ObjectURL(u.st.Bucket, u.st.Key) }

func (u *Upload) wakeUp() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// Durable says the stream's bytes [0, off) are on the local disk (fdatasynced); the upload
// may send them. Called from the session's writer: it never blocks.
func (u *Upload) Durable(off int64) {
	for {
		cur := u.durable.Load()
		if off <= cur || u.durable.CompareAndSwap(cur, off) {
			break
		}
	}
	u.wakeUp()
}

// Finish says the stream has ended: its file is final. The upload completes the object,
// verifies it, uploads the side files beside it and then, unless kept, deletes the local
// files. It returns at once; Done is closed when the upload has ended.
func (u *Upload) Finish(sides []SideFile) error {
	// Nothing is freed once the session ended, and the descriptor shares the client's
	// lock on the file: a resume waits for it.
	u.closePunch()
	var err error
	for {
		if err = unix.Fdatasync(int(u.f.Fd())); err != unix.EINTR {
			break
		}
	}
	fi, serr := u.f.Stat()
	if serr != nil {
		err = errors.Join(err, serr)
	}
	var recs []Side
	var files []SideFile
	for _, sd := range sides {
		var fst unix.Stat_t
		if err := unix.Fstat(int(sd.File.Fd()), &fst); err != nil {
			sd.File.Close()
			continue
		}
		files = append(files, sd)
		recs = append(recs, Side{Path: sd.Path, Key: Target{Bucket: u.st.Bucket, Prefix: prefixOf(u.st.Key)}.Key(sd.Path),
			Dev: uint64(fst.Dev), Ino: fst.Ino})
	}
	// The end of the stream goes into the state file now, whatever the upload is doing (a
	// part blocked on a server that hangs): a strapd killed from here on completes the
	// upload after its restart.
	u.saveMu.Lock()
	u.mu.Lock()
	if serr == nil {
		u.finalReq = fi.Size()
	}
	u.sidesReq, u.finSides = files, recs
	u.mu.Unlock()
	if serr == nil {
		if werr := u.recordFinish(); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	u.saveMu.Unlock()
	if serr == nil {
		u.Durable(fi.Size())
	}
	select {
	case u.finishSig <- struct{}{}:
	default:
	}
	u.wakeUp()
	if err != nil {
		return fmt.Errorf("finish upload of %s: %w", u.st.Path, err)
	}
	return nil
}

// recordFinish writes the last state written with Finish's request applied (u.saveMu held).
func (u *Upload) recordFinish() error {
	st, err := ParseState(u.saved)
	if err != nil || st.FinalSize >= 0 {
		return err // ended already (a state found at a restart, strapd upload)
	}
	if !u.applyFinish(st) {
		return nil // the goroutine reports why (takeFinish)
	}
	b, err := st.write(u.m.o.StateDir)
	if err == nil {
		u.saved = b
	}
	return err
}

// applyFinish applies Finish's request to st, as takeFinish does; false when it cannot
// (a part past the end holds freed bytes: the upload goroutine reports them lost).
func (u *Upload) applyFinish(st *State) bool {
	u.mu.Lock()
	final, recs, stale, keep := u.finalReq, u.finSides, u.staleReq, u.keepReq
	u.mu.Unlock()
	if final < 0 {
		return false
	}
	for _, p := range st.Parts {
		if partStart(st.PartSize, p.Number)+p.Size > final && partStart(st.PartSize, p.Number) < st.FreedTo {
			return false
		}
	}
	st.endAt(final, keep, recs, stale)
	return true
}

// save writes the upload's state file (the goroutine's state); while Finish's request is
// not taken yet, with it applied, so that no write loses the stream's end.
func (u *Upload) save() error {
	u.saveMu.Lock()
	defer u.saveMu.Unlock()
	w := u.st
	u.mu.Lock()
	pending := u.finalReq >= 0
	u.mu.Unlock()
	if pending && u.st.FinalSize < 0 {
		b, err := json.Marshal(u.st)
		if err != nil {
			return err
		}
		var c State
		if err := json.Unmarshal(b, &c); err != nil {
			return err
		}
		if u.applyFinish(&c) {
			w = &c
		}
	}
	b, err := w.write(u.m.o.StateDir)
	if err == nil {
		u.saved = b
	}
	return err
}

// CRCSource is the CRC32C of a stream file's bytes [0, off) where the writer knows it
// (stream.RangeCRCs): at every part boundary and the stream's end.
type CRCSource interface {
	At(off int64) (uint32, bool)
}

// UseCRCs has the upload take its parts' CRC32C from the writer's record instead of
// reading each part back from the disk (the most of the upload's CPU: PERFORMANCE.md).
// Parts the record does not cover (a resumed prefix, a restart) are read back; so is a
// part the server refuses as not matching, and the record is dropped then.
// STRAP_UPLOAD_CRC=readback ignores it (an A/B switch for bench-upload).
func (u *Upload) UseCRCs(src CRCSource) {
	if !writerCRCsEnabled {
		return
	}
	u.mu.Lock()
	u.crcs = src
	u.mu.Unlock()
}

// writerCRC is part [start, start+size)'s CRC32C from the writer's record, if it has both ends.
func (u *Upload) writerCRC(start, size int64) (uint32, bool) {
	u.mu.Lock()
	src := u.crcs
	u.mu.Unlock()
	if src == nil {
		return 0, false
	}
	a, ok := src.At(start)
	if !ok {
		return 0, false
	}
	b, ok := src.At(start + size)
	if !ok {
		return 0, false
	}
	return crc32c.Suffix(b, a, size), true
}

// forgetCRCs lets the writer's record drop the values before off (acknowledged parts):
// one per part would otherwise grow with the capture. A part sent again after that (the
// server lost it) is read back.
func (u *Upload) forgetCRCs(off int64) {
	u.mu.Lock()
	src := u.crcs
	u.mu.Unlock()
	if f, ok := src.(interface{ Forget(int64) }); ok {
		f.Forget(off)
	}
}

// RemoveBeside names objects beside the stream's (base names, like the side files') that an
// earlier upload of the same capture left and the finished capture no longer has: the
// checkpoint an aborted session's upload carried, once a resumed session ends complete
// (OBJECT_STORAGE.md). They are deleted after the object is complete and verified. Call
// it before Finish.
func (u *Upload) RemoveBeside(names ...string) {
	u.mu.Lock()
	u.staleReq = append(u.staleReq, names...)
	u.mu.Unlock()
}

// KeepLocal keeps this stream's local files once uploaded, whatever the daemon's option:
// a stream that did not end complete (client killed, session failed) may be resumed, and
// a resume needs the local file. Call it before Finish.
func (u *Upload) KeepLocal() {
	u.mu.Lock()
	u.keepReq = true
	u.mu.Unlock()
}

// Abandon stops the upload where it is, keeping its state file (a session that could not
// start after all; a resumed capture of the file continues it).
func (u *Upload) Abandon() {
	u.cancel()
	<-u.finishedC
}

// Done is closed once the upload has ended (complete, or stopped with strapd).
func (u *Upload) Done() <-chan struct{} { return u.finishedC }

// Status is the upload's status now.
func (u *Upload) Status() Status {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.status
	s.DurableBytes = u.durable.Load()
	if s.FinalSize >= 0 {
		s.DurableBytes = s.FinalSize
	}
	if s.LagBytes = s.DurableBytes - s.UploadedBytes; s.LagBytes < 0 {
		s.LagBytes = 0
	}
	if s.State == StateUploading || s.State == StateRetrying {
		if d := u.track.waitingFor(); d > u.m.o.Client.StallAfter() {
			s.State = StateStalled
			why := fmt.Sprintf("no answer from the server for %ds", int(d.Seconds()))
			if s.LastError != "" {
				why += "; last error: " + s.LastError
			}
			s.LastError = why
		}
	}
	return s
}

func (u *Upload) isDone() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.done
}

func (u *Upload) setStatus(f func(*Status)) {
	u.mu.Lock()
	f(&u.status)
	u.mu.Unlock()
}

func (u *Upload) run() {
	ctx := u.ctx
	defer close(u.finishedC)
	defer func() {
		u.f.Close()
		for _, f := range u.sides {
			f.Close()
		}
		// However the upload ends (Abandon included): the punching descriptor shares the
		// client's lock on the stream, which a resume or a new capture waits for.
		u.closePunch()
	}()
	backoff := u.m.o.MinBackoff
	log := u.m.o.Log.With(zap.String("object", u.object()))
	for {
		select {
		case <-ctx.Done():
			u.setStatus(func(s *Status) { s.State = StateStopped })
			return
		case <-u.wake:
		}
		done, err := u.step(ctx)
		if errors.Is(err, ErrKeyTaken) {
			u.refuse(err, log)
			return
		}
		var lost *LostError
		if errors.As(err, &lost) {
			u.m.errs.Add(1)
			msg := trimErr(err.Error())
			u.mu.Lock()
			u.status.State, u.status.Lost, u.status.LastError = StateLost, lost.Range(), msg
			u.status.Errors++
			u.done = true
			u.mu.Unlock()
			log.Error("upload cannot be completed: bytes freed on the local disk are missing on the server", zap.String("error", msg),
				zap.Int64("lost_from", lost.From), zap.Int64("lost_to", lost.To))
			return
		}
		if err == nil {
			backoff = u.m.o.MinBackoff
			if done {
				return
			}
			continue
		}
		if ctx.Err() != nil {
			u.setStatus(func(s *Status) { s.State = StateStopped })
			return
		}
		u.m.errs.Add(1)
		msg := trimErr(Describe(err))
		u.setStatus(func(s *Status) { s.Errors++; s.LastError = msg; s.State = StateRetrying })
		log.Warn("upload attempt failed; the local file is kept and the upload retried", zap.String("error", msg),
			zap.Duration("retry_in", backoff), zap.Bool("needs_fixing", permanent(err)))
		if !u.sleep(ctx, backoff) {
			u.setStatus(func(s *Status) { s.State = StateStopped })
			return
		}
		if backoff *= 2; backoff > u.m.o.MaxBackoff {
			backoff = u.m.o.MaxBackoff
		}
		u.wakeUp()
	}
}

// refuse ends an upload whose key holds another capture's object: its multipart upload
// (if it made one) is aborted, its state file and journal removed; the local files stay.
func (u *Upload) refuse(err error, log *zap.Logger) {
	st := u.st
	u.m.errs.Add(1)
	msg := trimErr(err.Error())
	if st.UploadID != "" {
		ctx, cancel := context.WithTimeout(u.ctx, u.m.o.Client.callTimeout(0))
		if aerr := u.m.o.Client.abort(ctx, st.Bucket, st.Key, st.UploadID); aerr != nil && !notFound(aerr) {
			log.Warn("abort the refused upload's multipart upload", zap.Error(aerr))
		}
		cancel()
	}
	for _, p := range []string{u.m.statePath(st), u.m.journalPath(st)} {
		if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			log.Warn("remove the refused upload's state", zap.Error(rerr))
		}
	}
	u.mu.Lock()
	u.status.State, u.status.LastError = StateRefused, msg
	u.status.Errors++
	u.done = true
	u.mu.Unlock()
	log.Error("upload refused: the key holds another capture's object; the local files are kept", zap.String("error", msg))
}

// sleep waits out a backoff; a Finish meanwhile is written into the state file at once
// (a strapd killed during the wait then completes the upload after its restart). It
// reports false when ctx ended.
func (u *Upload) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-u.finishSig:
			if err := u.takeFinish(); err != nil {
				u.m.o.Log.Warn("record the stream's end in the upload state", zap.Error(err))
			}
		}
	}
}

// step sends what may go now; done when the object is complete and everything after it too.
func (u *Upload) step(ctx context.Context) (bool, error) {
	st := u.st
	u.flushJournalIfLarge() // freeing's index journal: bounded in memory, whatever the server does
	if u.reconcile {
		if err := u.reconcileParts(ctx); err != nil {
			return false, err
		}
		u.reconcile = false
	}
	if err := u.takeFinish(); err != nil {
		return false, err
	}
	avail := u.durable.Load()
	if st.FinalSize >= 0 {
		avail = st.FinalSize
	}
	buf := make([]byte, crcBufSize)
	if len(st.Copy) > 0 {
		// A resumed capture whose earlier object holds its freed bytes: those parts come
		// from it before any part goes from the file.
		if err := u.copyFromSource(ctx); err != nil {
			return false, err
		}
	}
	for {
		next := int32(len(st.Parts)) + 1
		var batch []Part
		for k := int32(0); k < int32(u.m.o.Concurrency); k++ {
			n := next + k
			start, size := partStart(st.PartSize, n), partSize(st.PartSize, n)
			if start+size > avail {
				break
			}
			if n >= MaxParts {
				return false, fmt.Errorf("the stream outgrew S3's %d parts (first part size %d): restart strapd with a larger --upload-part-size", MaxParts, st.PartSize)
			}
			batch = append(batch, Part{Number: n, Size: size})
		}
		if len(batch) == 0 {
			break
		}
		if err := u.ensureUploadID(ctx); err != nil {
			return false, err
		}
		u.setStatus(func(s *Status) { s.State = StateUploading })
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i := range batch {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				b := buf
				if i > 0 {
					b = make([]byte, crcBufSize)
				}
				errs[i] = u.sendPart(ctx, &batch[i], b)
			}(i)
		}
		wg.Wait()
		ok := 0
		for ok < len(batch) && errs[ok] == nil {
			ok++
		}
		if ok > 0 {
			st.Parts = append(st.Parts, batch[:ok]...)
			if err := u.save(); err != nil {
				return false, err
			}
			up := st.uploaded()
			u.setStatus(func(s *Status) { s.UploadedBytes = up; s.Parts = len(st.Parts) })
			u.forgetCRCs(up)
			u.freeBehind()
		}
		if ok < len(batch) {
			if notFound(errs[ok]) {
				// The server forgot the upload while it went on: the next attempt
				// compares its parts with the server's (and starts anew, or reports the
				// freed bytes lost).
				u.reconcile = true
			}
			return false, errs[ok]
		}
	}
	u.freeBehind() // a checkpoint may have moved the bound without a new part
	if st.FinalSize < 0 {
		return false, nil
	}
	return true, u.completeAll(ctx, buf)
}

// takeFinish moves Finish's request into the state (and the state file).
func (u *Upload) takeFinish() error {
	u.mu.Lock()
	final, sides, recs, stale, keepLocal := u.finalReq, u.sidesReq, u.finSides, u.staleReq, u.keepReq
	if final < 0 {
		u.mu.Unlock()
		return nil
	}
	u.finalReq, u.sidesReq, u.finSides, u.staleReq = -1, nil, nil, nil
	u.mu.Unlock()
	st := u.st
	// Full parts past the final size go again: none of them may hold a freed byte.
	for _, p := range st.Parts {
		if e := partStart(st.PartSize, p.Number) + p.Size; e > final {
			if err := u.lost(partStart(st.PartSize, p.Number), fmt.Sprintf("part %d ends past the stream's final size %d", p.Number, final)); err != nil {
				u.mu.Lock()
				u.finalReq, u.sidesReq, u.finSides, u.staleReq = final, sides, recs, stale // the next step meets it again
				u.mu.Unlock()
				return err
			}
			break
		}
	}
	st.endAt(final, keepLocal, recs, stale)
	for _, sd := range sides {
		u.sides = append(u.sides, sd.File)
	}
	u.setStatus(func(s *Status) { s.FinalSize = final })
	return u.save()
}

// addSides records side files, each replacing one recorded under the same key (strapd
// upload continuing a capture's upload names the files beside the stream again).
// endAt records the stream's end: its final size, whether its local files stay, its side
// files and the keys of stale objects to delete. Full parts past the end (bytes cut back
// after a failed write) go again as the last part, and a completion begun before is
// begun anew.
func (s *State) endAt(final int64, keepLocal bool, sides []Side, stale []string) {
	s.FinalSize = final
	s.KeepLocal = s.KeepLocal || keepLocal
	k := 0
	for k < len(s.Parts) && partStart(s.PartSize, s.Parts[k].Number)+s.Parts[k].Size <= final {
		k++
	}
	s.Parts = s.Parts[:k]
	s.dropCompletion()
	s.addSides(sides)
	for _, name := range stale {
		s.Stale = append(s.Stale, Target{Bucket: s.Bucket, Prefix: prefixOf(s.Key)}.Key(name))
	}
}

func (s *State) addSides(recs []Side) {
	for _, r := range recs {
		i := 0
		for i < len(s.Sides) && s.Sides[i].Key != r.Key {
			i++
		}
		if i < len(s.Sides) {
			s.Sides[i] = r
		} else {
			s.Sides = append(s.Sides, r)
		}
	}
}

// prefixOf is the key's prefix (its directory in key terms).
func prefixOf(key string) string {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i]
	}
	return ""
}

func (u *Upload) ensureUploadID(ctx context.Context) error {
	st := u.st
	if st.UploadID != "" {
		return nil
	}
	avail := u.durable.Load()
	if st.FinalSize >= 0 {
		avail = st.FinalSize
	}
	if err := u.knowCapture(avail); err != nil {
		return fmt.Errorf("name the capture of %s: %w", st.Path, err)
	}
	// Nothing is sent to a key that holds another capture's object. A resumed, freed
	// capture's key holds its earlier object, named by its ETag (Source): one replaced
	// since makes the freed bytes lost (copyPart), not the key taken.
	if !u.overwrite && st.Source == nil {
		if _, err := u.claim(ctx); err != nil {
			return err
		}
	}
	// Recorded before it is sent: a request the server carries out without strapd
	// hearing the answer leaves a multipart upload nobody completes (sweep).
	prev := st.Sweep
	st.Sweep = true
	if err := u.save(); err != nil {
		st.Sweep = prev
		return err
	}
	id, err := u.m.o.Client.create(ctx, st.Bucket, st.Key, st.Capture)
	if err != nil {
		if answered(err) {
			st.Sweep = prev
		}
		return fmt.Errorf("create multipart upload %s: %w", u.object(), err)
	}
	st.UploadID, st.Sweep = id, prev
	return u.save()
}

// sendPart sends the part's bytes with their CRC32C, from the writer's record or read back
// from the file: the server refuses a part whose bytes do not match.
func (u *Upload) sendPart(ctx context.Context, p *Part, buf []byte) error {
	start := partStart(u.st.PartSize, p.Number)
	c, fromWriter := u.writerCRC(start, p.Size)
	if !fromWriter {
		u.m.readBack.Add(1)
		var err error
		if c, err = fileCRC(u.f, start, p.Size, buf); err != nil {
			return err
		}
	}
	p.CRC32C = crcB64(c)
	etag, err := u.m.o.Client.uploadPart(ctx, u.st.Bucket, u.st.Key, u.st.UploadID, p.Number, u.f, start, p.Size, p.CRC32C)
	if err != nil && fromWriter && badDigest(err) {
		// The record disagrees with the disk (it never should): read back from here on.
		u.m.o.Log.Warn("the writer's CRC of a part does not match the file; parts are read back from here on",
			zap.String("object", u.object()), zap.Int32("part", p.Number), zap.String("error", Describe(err)))
		u.mu.Lock()
		u.crcs = nil
		u.mu.Unlock()
		u.m.readBack.Add(1)
		if c, err = fileCRC(u.f, start, p.Size, buf); err != nil {
			return err
		}
		p.CRC32C = crcB64(c)
		etag, err = u.m.o.Client.uploadPart(ctx, u.st.Bucket, u.st.Key, u.st.UploadID, p.Number, u.f, start, p.Size, p.CRC32C)
	}
	if err != nil {
		return fmt.Errorf("upload part %d of %s: %w", p.Number, u.object(), err)
	}
	p.ETag = etag
	u.m.uploaded.Add(uint64(p.Size))
	return nil
}

// copyFromSource re-creates the earlier object's parts that hold freed bytes (st.Copy) in
// this multipart upload, after finishing that object's completion when the resume came
// while it was being completed.
func (u *Upload) copyFromSource(ctx context.Context) error {
	st, src := u.st, u.st.Source
	if src.ETag == "" {
		err := u.m.o.Client.complete(ctx, st.Bucket, st.Key, src.UploadID, src.Parts, Condition{})
		if err != nil && !notFound(err) {
			return fmt.Errorf("complete the object of the capture's earlier session %s: %w", u.object(), err)
		}
		etag, _, verr := u.checkObject(ctx, src.Size, src.Parts, err == nil)
		if verr != nil {
			if errors.Is(verr, errObjectWrong) {
				if lerr := u.lost(0, "the object of the capture's earlier session, which holds them, does not verify ("+Describe(verr)+")"); lerr != nil {
					return lerr
				}
			}
			return verr
		}
		src.ETag = etag
		if err := u.save(); err != nil {
			return err
		}
	}
	if err := u.ensureUploadID(ctx); err != nil {
		return err
	}
	defer func() {
		if len(st.Copy) == 0 {
			u.m.o.Log.Info("parts holding freed bytes re-created from the capture's earlier object", zap.String("object", u.object()),
				zap.Int("parts", len(st.Parts)), zap.Bool("server_side_copy", !u.noCopy.Load()))
		}
	}()
	for len(st.Copy) > 0 {
		// The first part alone (it finds out whether the server's copies can be
		// checked), then as many at once as parts go.
		n := 1
		if u.copyTried {
			n = min(len(st.Copy), u.m.o.Concurrency)
		}
		batch := st.Copy[:n]
		etags, errs := make([]string, n), make([]error, n)
		var wg sync.WaitGroup
		for i := range batch {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				etags[i], errs[i] = u.copyPart(ctx, batch[i])
			}(i)
		}
		wg.Wait()
		u.copyTried = true
		ok := 0
		for ok < n && errs[ok] == nil {
			p := batch[ok]
			p.ETag = etags[ok]
			st.Parts = append(st.Parts, p)
			ok++
		}
		if st.Copy = st.Copy[ok:]; len(st.Copy) == 0 {
			st.Copy = nil
		}
		if ok > 0 {
			if err := u.save(); err != nil {
				return err
			}
			up := st.uploaded()
			u.setStatus(func(s *Status) { s.UploadedBytes = up; s.Parts = len(st.Parts) })
		}
		if ok < n {
			if apiCode(errs[ok]) == "NoSuchUpload" {
				u.reconcile = true // as in step
			}
			return errs[ok]
		}
	}
	return nil
}

// copyPart makes part p of this upload from the same bytes of the earlier object: by
// UploadPartCopy where the server reports the copy's CRC32C and it is the part's, else
// read back through strapd into an UploadPart the server checks against that CRC32C.
// The earlier object changed or gone (its ETag), or its bytes not the part's: the freed
// bytes are lost.
func (u *Upload) copyPart(ctx context.Context, p Part) (string, error) {
	st, src, c := u.st, u.st.Source, u.m.o.Client
	start := partStart(st.PartSize, p.Number)
	gone := func(err error) error {
		return u.lost(start, fmt.Sprintf("the object of the capture's earlier session, which holds them, changed or is gone (%s)", Describe(err)))
	}
	if !u.noCopy.Load() {
		etag, crc, err := c.copyPart(ctx, st.Bucket, st.Key, st.UploadID, p.Number, src.ETag, start, p.Size)
		switch {
		case err == nil && crc == p.CRC32C:
			u.m.copied.Add(uint64(p.Size))
			return etag, nil
		case err == nil:
			// VersityGW 1.8.0 reports the source object's checksum for a copied part, and
			// then refuses to complete with the part's own.
			u.noCopy.Store(true)
			u.m.o.Log.Info("the server's copy of a part does not report the part's CRC32C; parts are read back through strapd instead",
				zap.String("object", u.object()), zap.String("reported", crc), zap.String("expected", p.CRC32C))
		case apiCode(err) == "NoSuchUpload":
			return "", err
		case sourceGone(err):
			if lerr := gone(err); lerr != nil {
				return "", lerr
			}
			return "", err
		case apiCode(err) == "NotImplemented":
			u.noCopy.Store(true)
		default:
			return "", fmt.Errorf("copy part %d of %s from its earlier object: %w", p.Number, u.object(), err)
		}
	}
	etag, err := c.uploadPartFromObject(ctx, st.Bucket, st.Key, st.UploadID, p.Number, src.ETag, start, p.Size, p.CRC32C)
	if err != nil {
		if apiCode(err) == "NoSuchUpload" {
			return "", err
		}
		if sourceGone(err) || badDigest(err) {
			if lerr := gone(err); lerr != nil {
				return "", lerr
			}
		}
		return "", fmt.Errorf("part %d of %s from its earlier object: %w", p.Number, u.object(), err)
	}
	u.m.copied.Add(uint64(p.Size))
	return etag, nil
}

// reconcileParts compares the recorded parts with the server's list (after a restart or a
// resumed capture): parts from the first that differs on are sent again; an upload the
// server no longer knows starts anew, unless its object is already complete.
func (u *Upload) reconcileParts(ctx context.Context) error {
	st := u.st
	if st.UploadID == "" {
		return nil
	}
	have, err := u.m.o.Client.listParts(ctx, st.Bucket, st.Key, st.UploadID)
	if notFound(err) && st.Source != nil && st.Source.ETag != "" {
		// The new multipart upload is gone, the earlier object is not: its parts with
		// freed bytes are copied again, the rest sent again from the file.
		u.m.o.Log.Warn("the server no longer knows the multipart upload; starting it anew from the earlier object", zap.String("object", u.object()))
		st.UploadID, st.Parts, st.Copy = "", nil, nil
		for _, p := range st.Source.Parts {
			if partStart(st.PartSize, p.Number) < st.FreedTo {
				st.Copy = append(st.Copy, p)
			}
		}
		st.dropCompletion()
		return u.save()
	}
	if notFound(err) {
		why := "the server no longer knows the multipart upload"
		if st.FinalSize >= 0 {
			// Perhaps completed just before strapd stopped (st.Completing says it was
			// about to be): the object decides, verified against the parts it was
			// completed from. Only a missing or wrong object is sent anew (or lost).
			parts := st.objectParts()
			var how string
			verr := u.verify(ctx, parts, false, &how)
			if verr == nil {
				u.m.o.Log.Info("the object was completed before strapd stopped, and verifies", zap.String("object", u.object()),
					zap.Int("parts", len(parts)))
				// Verified the way an unheard completion is (read back where the server
				// keeps no checksum): the final verification need not read it again.
				u.completed, u.heard, u.verifiedHow = parts, true, how
				return nil
			}
			if !errors.Is(verr, errObjectWrong) {
				return verr // the request failed: nothing is known, the next attempt asks again
			}
			why += ", and " + Describe(verr)
			u.overwrite = st.Completing // completed by this upload before strapd stopped
		}
		if lerr := u.lost(0, why); lerr != nil {
			return lerr
		}
		u.m.o.Log.Warn("the server no longer knows the multipart upload; starting it anew", zap.String("object", u.object()),
			zap.String("why", why))
		st.UploadID, st.Parts = "", nil
		st.dropCompletion()
		return u.save()
	}
	if err != nil {
		return fmt.Errorf("list parts of %s: %w", u.object(), err)
	}
	if t := st.Tail; t != nil {
		// Not completed yet: the tail part must still be the one recorded.
		if sp, ok := have[t.Number]; !ok || sp.Size == nil || *sp.Size != t.Size || sp.ETag == nil || !sameETag(*sp.ETag, t.ETag) {
			st.dropCompletion()
			if err := u.save(); err != nil {
				return err
			}
		}
	}
	keep := 0
	for keep < len(st.Parts) {
		p := st.Parts[keep]
		sp, ok := have[p.Number]
		if !ok || sp.Size == nil || *sp.Size != p.Size || sp.ETag == nil || !sameETag(*sp.ETag, p.ETag) {
			break
		}
		keep++
	}
	if keep < len(st.Parts) {
		p := st.Parts[keep]
		if lerr := u.lost(partStart(st.PartSize, p.Number), fmt.Sprintf("part %d is missing on the server or differs from the one sent", p.Number)); lerr != nil {
			return lerr
		}
		u.m.o.Log.Info("parts sent again after a restart", zap.String("object", u.object()), zap.Int("from_part", keep+1))
		st.Parts = st.Parts[:keep]
		st.dropCompletion()
		return u.save()
	}
	return nil
}

// completeAll sends the last part, completes the object, verifies it, uploads the side
// files, deletes the local files unless kept, and removes the state file.
func (u *Upload) completeAll(ctx context.Context, buf []byte) error {
	st := u.st
	if u.completed != nil {
		// Completed by an earlier attempt whose verification could not ask the server:
		// sending the last part again would find no multipart upload any more.
		return u.verifyAndFinish(ctx, u.completed, buf)
	}
	if !st.Completing {
		next := int32(len(st.Parts)) + 1
		if start := partStart(st.PartSize, next); start < st.FinalSize {
			if err := u.ensureUploadID(ctx); err != nil {
				return err
			}
			tail := Part{Number: next, Size: st.FinalSize - start}
			if err := u.sendPart(ctx, &tail, buf); err != nil {
				if notFound(err) {
					u.reconcile = true // as in step
				}
				return err
			}
			st.Tail = &tail
		}
		if st.UploadID != "" {
			// The intent, durable before the request: the server may complete the object
			// and strapd die before it hears so; its restart then finds the object, not
			// the multipart upload, and verifies it against these parts
			// (reconcileParts) instead of taking it for missing.
			st.Completing, st.Source, st.Copy = true, nil, nil // every copied part is in Parts by now
			if err := u.save(); err != nil {
				st.dropCompletion()
				return err
			}
		}
	}
	parts := st.objectParts()
	if st.UploadID != "" {
		// The key checked again, and the object completed on the condition that it is
		// still what the check found (where the server takes conditions): another
		// capture's object written meanwhile is never replaced.
		var cond Condition
		var err error
		if !u.overwrite {
			if cond, err = u.claim(ctx); err != nil {
				return err
			}
		}
		err = u.m.o.Client.complete(ctx, st.Bucket, st.Key, st.UploadID, parts, cond)
		if err != nil && !notFound(err) {
			return fmt.Errorf("complete %s: %w", u.object(), err)
		}
		// NoSuchUpload: completed by an attempt whose answer was lost; verify decides.
		u.heard = err == nil
	}
	u.completed = parts
	return u.verifyAndFinish(ctx, parts, buf)
}

// verifyAndFinish verifies the completed object, then uploads the side files, deletes what
// is stale beside it and, unless kept, the local files.
func (u *Upload) verifyAndFinish(ctx context.Context, parts []Part, buf []byte) error {
	st := u.st
	etag, verified, err := u.checkObject(ctx, st.FinalSize, parts, u.heard)
	if err == nil && u.verifiedHow != "" {
		verified = u.verifiedHow
	}
	if err != nil {
		if !errors.Is(err, errObjectWrong) {
			// The HEAD itself failed (the server away, a timeout): the object may well be
			// right. The next attempt verifies again (u.completed); nothing is sent anew,
			// nothing lost.
			return err
		}
		u.completed, u.heard, u.verifiedHow = nil, false, ""
		u.overwrite = true
		if lerr := u.lost(0, "the completed object does not verify ("+Describe(err)+")"); lerr != nil {
			return lerr
		}
		// A wrong object is never left as if it were right: the next attempt sends it anew.
		st.UploadID, st.Parts = "", nil
		st.dropCompletion()
		if serr := u.save(); serr != nil {
			err = errors.Join(err, serr)
		}
		return err
	}
	up := st.FinalSize
	u.setStatus(func(s *Status) { s.UploadedBytes = up; s.Parts = len(parts); s.Verified = verified })
	if st.Sweep {
		if err := u.sweep(ctx); err != nil {
			return err
		}
	}
	for i, sd := range st.Sides {
		if err := u.putSide(ctx, i, sd, buf); err != nil {
			return err
		}
	}
	for _, key := range st.Stale {
		if err := u.m.o.Client.deleteObject(ctx, st.Bucket, key); err != nil && !notFound(err) {
			return fmt.Errorf("delete %s, left by an earlier upload of this capture: %w", ObjectURL(st.Bucket, key), err)
		}
	}
	deleted := false
	if !st.KeepLocal {
		var errs []error
		for _, p := range append([]Side{{Path: st.Path, Dev: st.Dev, Ino: st.Ino}}, st.Sides...) {
			if sameFile(p.Path, p.Dev, p.Ino) {
				if err := os.Remove(p.Path); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := errors.Join(errs...); err != nil {
			u.m.o.Log.Warn("delete local copy after upload", zap.Error(err))
		} else {
			deleted = true
		}
	}
	if st.KeepLocal && st.FreedTo > 0 {
		// A session that did not end complete, its local stream freed behind the upload:
		// the object holds the whole stream (and its checkpoint is beside it), so it can
		// be resumed anywhere; a resume on this host goes on from this state and the index
		// journal (Begin: the freed parts are re-created from the object).
		st.Completed = etag
		if err := u.save(); err != nil {
			return err
		}
		u.m.o.Log.Info("the upload state and index journal are kept for a resume of the capture on this host",
			zap.String("object", u.object()), zap.Int64("freed_from", st.FreedFrom), zap.Int64("freed_to", st.FreedTo))
	} else {
		if err := os.Remove(u.m.statePath(st)); err != nil && !errors.Is(err, os.ErrNotExist) {
			u.m.o.Log.Warn("remove upload state", zap.Error(err))
		}
		if err := os.Remove(u.m.journalPath(st)); err != nil && !errors.Is(err, os.ErrNotExist) {
			u.m.o.Log.Warn("remove index journal", zap.Error(err))
		}
	}
	u.m.o.Log.Info("upload complete", zap.String("object", u.object()), zap.Int64("bytes", st.FinalSize),
		zap.Int("parts", len(parts)), zap.String("verified", verified), zap.Int("side_files", len(st.Sides)), zap.Bool("local_deleted", deleted))
	u.mu.Lock()
	u.status.State = StateComplete
	u.status.LocalDeleted = deleted
	u.status.LastError = ""
	u.done = true
	u.mu.Unlock()
	return nil
}

// errObjectWrong marks a verification that found the object wrong or missing, as opposed
// to one whose request failed.
var errObjectWrong = errors.New("the object does not match the stream")

// verify checks the object's size against the file's and its CRC32C as the server reports
// it against the parts strapd sent (each part's CRC32C was checked by the server as it
// arrived): the composite form ("-N", what S3 keeps for a multipart upload with CRC32C)
// against the CRC32C of the parts' CRC32Cs, a full-object CRC32C against the parts' values
// combined. A server that reports no checksum leaves the size; unless heard (strapd
// heard the server answer its own CompleteMultipartUpload for these parts), the object is
// then read back and each part's CRC32C compared: an object found after a restart may
// have been written by someone else since.
func (u *Upload) verify(ctx context.Context, parts []Part, heard bool, what *string) error {
	_, v, err := u.checkObject(ctx, u.st.FinalSize, parts, heard)
	if err == nil && what != nil {
		*what = v
	}
	return err
}

// checkObject is verify for an object of want bytes made of parts; it returns the
// object's ETag and what was checked.
func (u *Upload) checkObject(ctx context.Context, want int64, parts []Part, heard bool) (etag, v string, err error) {
	return u.m.o.Client.checkObject(ctx, u.st.Bucket, u.st.Key, want, parts, heard)
}

// checkObject is Upload.checkObject for the object bucket/key (strapd salvage checks the
// object it completed from an upload it did not send the same way).
func (c *Client) checkObject(ctx context.Context, bucket, key string, want int64, parts []Part, heard bool) (etag, v string, err error) {
	object := ObjectURL(bucket, key)
	size, crc, etag, err := c.head(ctx, bucket, key)
	if err != nil {
		if notFound(err) {
			return "", "", fmt.Errorf("verify %s: %w: the object is not there (%v)", object, errObjectWrong, err)
		}
		return "", "", fmt.Errorf("verify %s: %w", object, err) // the request failed: tried again
	}
	if size != want {
		return "", "", fmt.Errorf("verify %s: %w: the object has %d bytes, the stream file %d", object, errObjectWrong, size, want)
	}
	v = "size; each part's CRC32C checked by the server on upload"
	switch {
	case crc != "" && strings.Contains(crc, "-") && len(parts) > 0:
		want, err := compositeCRC(parts)
		if err != nil {
			return "", "", fmt.Errorf("verify %s: %w: %v", object, errObjectWrong, err)
		}
		if crc != want {
			return "", "", fmt.Errorf("verify %s: %w: its CRC32C is %s, the parts sent make %s", object, errObjectWrong, crc, want)
		}
		v = "size and composite CRC32C of every part"
	case crc != "" && len(parts) > 0:
		want, err := wholeCRC(parts)
		if err != nil {
			return "", "", fmt.Errorf("verify %s: %w: %v", object, errObjectWrong, err)
		}
		if crc != want {
			return "", "", fmt.Errorf("verify %s: %w: its CRC32C is %s, the parts sent make %s", object, errObjectWrong, crc, want)
		}
		v = "size and CRC32C of the whole object"
	case !heard && len(parts) > 0:
		buf := make([]byte, crcBufSize)
		var off int64
		for _, p := range parts {
			got, err := c.rangeCRC(ctx, bucket, key, off, p.Size, buf)
			if err != nil {
				if notFound(err) {
					return "", "", fmt.Errorf("verify %s: %w: the object is not there (%v)", object, errObjectWrong, err)
				}
				return "", "", fmt.Errorf("verify %s: read part %d back: %w", object, p.Number, err)
			}
			if crcB64(got) != p.CRC32C {
				return "", "", fmt.Errorf("verify %s: %w: bytes [%d, %d) read back have CRC32C %s, part %d sent had %s",
					object, errObjectWrong, off, off+p.Size, crcB64(got), p.Number, p.CRC32C)
			}
			off += p.Size
		}
		v = "size and CRC32C of every part, read back (the server reports no checksum)"
	}
	return etag, v, nil
}

func (u *Upload) putSide(ctx context.Context, i int, sd Side, buf []byte) error {
	var f *os.File
	if i < len(u.sides) {
		f = u.sides[i]
	} else {
		var err error
		if f, err = openSame(sd.Path, sd.Dev, sd.Ino); err != nil {
			u.m.o.Log.Warn("side file gone before its upload; skipped", zap.String("path", sd.Path), zap.Error(err))
			return nil
		}
		u.sides = append(u.sides, f)
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > MaxPartSize {
		return fmt.Errorf("side file %s has %d bytes, more than one PUT takes (%d)", sd.Path, fi.Size(), int64(MaxPartSize))
	}
	c, err := fileCRC(f, 0, fi.Size(), buf)
	if err != nil {
		return err
	}
	if err := u.m.o.Client.putFile(ctx, u.st.Bucket, sd.Key, f, fi.Size(), crcB64(c)); err != nil {
		return fmt.Errorf("upload %s to %s: %w", sd.Path, ObjectURL(u.st.Bucket, sd.Key), err)
	}
	return nil
}
