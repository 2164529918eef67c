package upload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/stream"
)

// Options configure a Manager.
type Options struct {
	// Client reaches the object store.
	Client *Client
	// StateDir holds one state file per upload not yet complete.
	StateDir string
	// PartSize is the first parts' size (at least MinPartSize); parts double every 1000.
	PartSize int64
	// Concurrency is how many parts of one upload go at once (1 when 0).
	Concurrency int
	// KeepLocal keeps the local files once their objects are complete and verified.
	KeepLocal bool
	// FreeLocal frees a stream's uploaded bytes on the local disk while its capture goes on
	// (free.go); the local files are then deleted once complete, whatever KeepLocal says.
	FreeLocal bool
	// MinBackoff and MaxBackoff bound the wait between failed attempts (1 s and 1 min when 0).
	MinBackoff, MaxBackoff time.Duration
	// Log receives the uploads' log lines.
	Log *zap.Logger
}

// Manager runs the uploads of a daemon: one goroutine per stream, and the pending ones a
// restarted strapd finds in its state directory.
type Manager struct {
	o      Options
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	active map[string]*Upload // by state file name
	ended  []Status           // the most recent finished uploads, newest last
	// pending are uploads found in the state directory at start that this strapd did not
	// take up: streams still being written when strapd stopped (they wait for their
	// capture's resume, Begin) and those it could not reopen. Shown by Status until a
	// session takes one over.
	pending map[string]Status

	uploaded atomic.Uint64 // bytes acknowledged by the server, all uploads
	errs     atomic.Uint64
	readBack atomic.Uint64 // parts whose CRC32C was read back from the disk, all uploads
	freed    atomic.Uint64 // bytes freed on the local disk, all uploads
	copied   atomic.Uint64 // bytes re-created from an earlier object of the stream, all uploads
}

// maxEnded is how many finished uploads status keeps showing.
const maxEnded = 32

// NewManager checks the options and makes the state directory.
func NewManager(o Options) (*Manager, error) {
	if o.Client == nil {
		return nil, errors.New("upload: no client")
	}
	if o.PartSize == 0 {
		o.PartSize = 16 << 20
	}
	if o.PartSize < MinPartSize || o.PartSize > MaxPartSize {
		return nil, fmt.Errorf("upload part size %d outside S3's %d..%d", o.PartSize, MinPartSize, MaxPartSize)
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Minute
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.StateDir == "" {
		return nil, errors.New("upload: no state directory")
	}
	if o.FreeLocal {
		// A freed stream is no whole copy to keep: the object is.
		o.KeepLocal = false
	}
	// The directory is made with the first upload's state (State.save), not here: a
	// daemon that never uploads leaves nothing behind.
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{o: o, ctx: ctx, cancel: cancel, active: map[string]*Upload{}}, nil
}

// Client is the manager's S3 client.
func (m *Manager) Client() *Client { return m.o.Client }

// PartSize is the first parts' size: sessions make their stream durable this often.
func (m *Manager) PartSize() int64 { return m.o.PartSize }

// KeepLocal says whether local files are kept once uploaded.
func (m *Manager) KeepLocal() bool { return m.o.KeepLocal }

// FreeLocal says whether uploaded bytes are freed on the local disk during a capture.
func (m *Manager) FreeLocal() bool { return m.o.FreeLocal }

// FreedBytes are the bytes freed on the local disk since the daemon started, all uploads.
func (m *Manager) FreedBytes() uint64 { return m.freed.Load() }

// StateDir is the directory of the state files.
func (m *Manager) StateDir() string { return m.o.StateDir }

// ResumePending starts every upload in the state directory whose stream had ended (its
// bytes are final): a strapd killed while uploading completes them after a restart. Streams
// still being written when strapd stopped wait for their capture to resume (Begin).
func (m *Manager) ResumePending() error {
	names, err := filepath.Glob(filepath.Join(m.o.StateDir, "upload-*.json"))
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range names {
		st, err := loadState(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st.Completed != "" {
			// Complete; kept for a resume of the capture on this host (its bytes were freed).
			m.o.Log.Info("upload state kept for a resume on this host: the object is complete", zap.String("object", ObjectURL(st.Bucket, st.Key)),
				zap.String("path", st.Path))
			continue
		}
		if st.FinalSize < 0 && !m.streamEnded(st, p) {
			m.o.Log.Info("upload waits for its capture to resume", zap.String("object", ObjectURL(st.Bucket, st.Key)),
				zap.String("path", st.Path), zap.Int("parts", len(st.Parts)))
			m.setPending(st, StateWaiting, fmt.Sprintf("strapd stopped while the capture was written (the stream has no end yet): the upload goes on when the capture resumes on this strapd; to upload the file as it is: strapd upload %s %s",
				st.Path, Target{Bucket: st.Bucket, Prefix: prefixOf(st.Key)}))
			continue
		}
		f, err := openSame(st.Path, st.Dev, st.Ino)
		if err != nil {
			err = fmt.Errorf("resume upload of %s to %s: %w (state %s kept)", st.Path, ObjectURL(st.Bucket, st.Key), err, p)
			m.setPending(st, StateStopped, err.Error())
			errs = append(errs, err)
			continue
		}
		if fi, err := f.Stat(); err != nil || fi.Size() != st.FinalSize {
			f.Close()
			err = fmt.Errorf("resume upload of %s: the file is no longer %d bytes (state %s kept)", st.Path, st.FinalSize, p)
			m.setPending(st, StateStopped, err.Error())
			errs = append(errs, err)
			continue
		}
		u := m.newUpload(st, f, 0)
		u.durable.Store(st.FinalSize)
		u.reconcile = true
		m.o.Log.Info("upload resumed after restart", zap.String("object", u.object()), zap.Int("parts_done", len(st.Parts)))
		m.start(u) // from here on the state is the upload's goroutine's
	}
	return errors.Join(errs...)
}

// streamEnded reports whether the stream of a state that does not record its end has one
// all the same (its footer: the session ended, and strapd stopped before it recorded that,
// as a strapd before this one could): the end is recorded and the upload completes. Its
// session's status is not known, so its local files are kept.
func (m *Manager) streamEnded(st *State, path string) bool {
	f, err := openSame(st.Path, st.Dev, st.Ino)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	r, err := stream.NewReader(f, fi.Size())
	if err != nil {
		return false
	}
	if _, err := r.Footer(); err != nil {
		return false
	}
	if st.FreedTo > fi.Size() {
		return false
	}
	st.endAt(fi.Size(), true, nil, nil)
	if err := st.save(m.o.StateDir); err != nil {
		m.o.Log.Warn("record the end of a finished stream in its upload state", zap.String("state", path), zap.Error(err))
		return false
	}
	m.o.Log.Info("the stream's end was not recorded for its upload, but the stream has ended: the upload completes",
		zap.String("object", ObjectURL(st.Bucket, st.Key)), zap.String("path", st.Path))
	return true
}

// setPending shows an upload of the state directory that no goroutine runs.
func (m *Manager) setPending(st *State, state, why string) {
	s := st.status(state)
	s.LastError = why
	m.mu.Lock()
	if m.pending == nil {
		m.pending = map[string]Status{}
	}
	m.pending[stateName(st.Dev, st.Ino)] = s
	m.mu.Unlock()
}

// openSame opens path read-only, without following a symlink, and only if it is still the
// file (device, inode) an upload began with.
func openSame(path string, dev, ino uint64) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if uint64(st.Dev) != dev || st.Ino != ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is no longer the file the upload began with", path)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Stream is a stream file a session writes, as Begin needs it.
type Stream struct {
	// File reads the stream (the upload closes it when done).
	File *os.File
	// Path is the file's path (from /proc/self/fd), for the object's name and a restart.
	Path string
	// Target is where the object goes: Target.Key(base name of Path).
	Target Target
	// AppendAt is the resumed prefix's size (0: a new stream). Parts wholly inside it are
	// kept from an earlier upload of the same file; later ones are uploaded again.
	AppendAt int64
	// Session numbers the capture session and UID is its owner (status).
	Session uint64
	UID     uint32
	// FreeLocal frees this stream's uploaded bytes while it is written (free.go), also
	// where the manager's option does not; Punch is then a writable descriptor of the
	// stream to free them with (the upload closes it when the session ends; nil: nothing
	// is freed).
	FreeLocal bool
	Punch     *os.File
	// Final: the file is finished and will not change (strapd upload). An upload of it
	// left unfinished in the state directory (by strapd serve, or an interrupted strapd
	// upload) to the same object goes on from its state rather than anew.
	Final bool
}

// Begin starts (or, for a resumed capture of the same file, continues) the upload of a
// stream. The upload goes as far as Durable says until Finish.
func (m *Manager) Begin(s Stream) (*Upload, error) {
	var fst unix.Stat_t
	if err := unix.Fstat(int(s.File.Fd()), &fst); err != nil {
		return nil, fmt.Errorf("stat stream: %w", err)
	}
	dev, ino := uint64(fst.Dev), fst.Ino
	name := stateName(dev, ino)
	m.mu.Lock()
	old := m.active[name]
	delete(m.pending, name) // taken over by this session
	m.mu.Unlock()
	if old != nil {
		// The file's earlier session ended (a client killed, then resumed on this daemon)
		// and its upload is still going: the new session rewrites the file from
		// AppendAt, so that upload stops where it is and this one goes on from its state.
		old.Abandon()
	}
	key := s.Target.Key(filepath.Base(s.Path))
	st, err := loadState(filepath.Join(m.o.StateDir, name))
	var journal *stream.Journal
	switch {
	case err == nil && s.Final && st.FinalSize >= 0 && st.FinalSize == fst.Size && st.Completed == "" && st.Bucket == s.Target.Bucket && st.Key == key:
		// Its state goes on: the parts acknowledged are kept (compared with the server's
		// list), the state file is removed and orphans aborted once the object is complete.
		// The side files are named again by this caller (opened, and read by index).
		st.Sides = nil
		m.o.Log.Info("upload continues from the state left by an earlier upload of the file", zap.String("object", ObjectURL(st.Bucket, st.Key)),
			zap.Int("parts", len(st.Parts)))
	case err == nil && s.AppendAt > 0 && st.FreedTo > 0 && (st.Bucket != s.Target.Bucket || st.Key != key):
		return nil, fmt.Errorf("bytes [%d, %d) of %s were freed on the local disk after their upload to %s: the resumed capture must upload to the same object (the freed bytes are only there)",
			st.FreedFrom, st.FreedTo, s.Path, ObjectURL(st.Bucket, st.Key))
	case err == nil && s.AppendAt > 0 && st.FreedTo > s.AppendAt:
		return nil, fmt.Errorf("the resume cuts %s back to %d bytes, before the end of its bytes freed after their upload (%d): those cannot be written again", s.Path, s.AppendAt, st.FreedTo)
	case err == nil && s.AppendAt > 0 && st.Bucket == s.Target.Bucket && st.Key == key && (st.UploadID != "" || st.Source != nil):
		if st.FreedTo > 0 {
			// The resume takes the freed packets' index entries from the journal.
			if journal, err = m.loadJournal(st, s.AppendAt); err != nil {
				return nil, fmt.Errorf("bytes [%d, %d) of %s were freed after their upload; their index: %w", st.FreedFrom, st.FreedTo, s.Path, err)
			}
		} else if rerr := os.Remove(m.journalPath(st)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return nil, fmt.Errorf("remove the stale index journal: %w", rerr)
		}
		// A resumed capture: keep the parts wholly inside the checked prefix.
		keep := 0
		for keep < len(st.Parts) && partStart(st.PartSize, st.Parts[keep].Number)+st.Parts[keep].Size <= s.AppendAt {
			keep++
		}
		if keep < len(st.Parts) && partStart(st.PartSize, st.Parts[keep].Number) < st.FreedTo {
			return nil, fmt.Errorf("the resume cuts %s back to %d bytes, inside part %d, which holds bytes freed after their upload (up to %d): that part cannot be sent again",
				s.Path, s.AppendAt, st.Parts[keep].Number, st.FreedTo)
		}
		if st.FreedTo > 0 && (st.Completing || st.Completed != "") {
			// The earlier session's object was completed (or was being completed) with
			// the whole stream: its parts holding freed bytes are re-created from it in
			// a new multipart upload (UploadPartCopy), the rest sent from the file.
			src := &Source{UploadID: st.UploadID, Size: st.FinalSize, Parts: st.objectParts(), ETag: st.Completed}
			var cp []Part
			for _, p := range st.Parts[:keep] {
				if partStart(st.PartSize, p.Number) < st.FreedTo {
					cp = append(cp, p)
				}
			}
			st.UploadID, st.Parts, st.Copy, st.Source, st.Completed = "", nil, cp, src, ""
			keep = len(cp)
		} else {
			st.Parts = st.Parts[:keep]
		}
		st.dropCompletion()
		st.FinalSize = -1
		// The earlier session's choice (kept: it did not end complete) is not this one's;
		// a stream with freed bytes is no whole copy to keep.
		st.KeepLocal = m.o.KeepLocal && !s.FreeLocal && st.FreedTo == 0
		st.Path = s.Path
		st.Sides = nil
		m.o.Log.Info("upload continues a resumed capture", zap.String("object", ObjectURL(st.Bucket, st.Key)),
			zap.Int("parts_kept", keep), zap.Int64("append_at", s.AppendAt))
	default:
		if err == nil && st.UploadID != "" {
			// The file was started anew (or goes elsewhere now): the old upload is dead.
			m.abortQuietly(st)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			m.o.Log.Warn("upload state unreadable, starting the upload anew", zap.Error(err))
		}
		if err == nil {
			if rerr := os.Remove(m.journalPath(st)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				return nil, fmt.Errorf("remove the stale index journal: %w", rerr)
			}
		}
		st = &State{Version: stateVersion, Bucket: s.Target.Bucket, Key: key, PartSize: m.o.PartSize,
			Path: s.Path, Dev: dev, Ino: ino, UID: s.UID, FinalSize: -1, KeepLocal: m.o.KeepLocal && !s.FreeLocal}
	}
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("object key: %w", err)
	}
	u := m.newUpload(st, s.File, s.Session)
	if st.UploadID == "" && st.Source == nil {
		if err := u.precheck(fst.Size, s.AppendAt > 0 || s.Final); err != nil {
			u.cancel()
			// The file's earlier upload, if any, was aborted above: its state is dead too.
			if rerr := os.Remove(m.statePath(st)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				m.o.Log.Warn("remove upload state", zap.Error(rerr))
			}
			return nil, err
		}
	}
	b, err := st.write(m.o.StateDir)
	if err != nil {
		u.cancel()
		return nil, err
	}
	u.saved = b
	u.reconcile = len(st.Parts) > 0
	if s.Final && st.FinalSize >= 0 {
		u.durable.Store(st.FinalSize)
	}
	if u.freeLocal = m.o.FreeLocal || s.FreeLocal; u.freeLocal {
		// A freed stream is no whole copy to keep: the object is.
		st.KeepLocal = false
		u.punch = s.Punch
	} else if s.Punch != nil {
		s.Punch.Close()
	}
	if journal != nil {
		u.journal, u.journalEnd = journal, journal.End()
	}
	m.start(u)
	return u, nil
}

// beginProbeTimeout bounds Begin's check of the key: an OPEN waits for it.
const beginProbeTimeout = 3 * time.Second

// precheck asks, as the upload begins, what its key holds: another capture's object
// refuses the upload at once (ErrKeyTaken; a new capture's header is not written yet, so
// any object is another capture's, while a resumed or finished file is named by its own).
// A check that fails (refused credentials, a missing bucket, no answer in time) is the
// upload's first error, shown in status at once; the upload itself checks again before
// it writes anything.
func (u *Upload) precheck(size int64, named bool) error {
	st := u.st
	if named {
		if id, err := captureID(u.f, size); err == nil {
			st.Capture = id
		}
	}
	o, err := u.m.o.Client.probe(u.ctx, st.Bucket, st.Key, min(u.m.o.Client.callTimeout(0), beginProbeTimeout))
	switch {
	case err != nil:
		u.m.errs.Add(1)
		msg := trimErr(Describe(err))
		u.setStatus(func(s *Status) { s.Errors++; s.LastError = msg; s.State = StateRetrying })
		u.m.o.Log.Warn("upload: the object key cannot be checked yet; the upload retries", zap.String("object", u.object()), zap.String("error", msg))
	case o != nil && (st.Capture == "" || o.Capture != st.Capture):
		return taken(st.Bucket, st.Key, o)
	}
	return nil
}

func (m *Manager) abortQuietly(st *State) {
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	if err := m.o.Client.abort(ctx, st.Bucket, st.Key, st.UploadID); err != nil && !notFound(err) {
		m.o.Log.Warn("abort stale multipart upload", zap.String("object", ObjectURL(st.Bucket, st.Key)), zap.Error(err))
	}
}

func (m *Manager) start(u *Upload) {
	m.mu.Lock()
	m.active[stateName(u.st.Dev, u.st.Ino)] = u
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		u.run()
		m.mu.Lock()
		if key := stateName(u.st.Dev, u.st.Ino); m.active[key] == u { // not a successor's
			delete(m.active, key)
		}
		if u.isDone() {
			m.ended = append(m.ended, u.Status())
			if len(m.ended) > maxEnded {
				m.ended = m.ended[len(m.ended)-maxEnded:]
			}
		}
		m.mu.Unlock()
	}()
}

// Status lists the uploads in progress, then the recently finished ones.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	act := make([]*Upload, 0, len(m.active))
	for _, u := range m.active {
		act = append(act, u)
	}
	ended := append([]Status(nil), m.ended...)
	out := make([]Status, 0, len(act)+len(m.pending)+len(ended))
	for name, s := range m.pending {
		if _, err := os.Stat(filepath.Join(m.o.StateDir, name)); errors.Is(err, os.ErrNotExist) {
			// Finished by another process (strapd upload of the file, with this state).
			delete(m.pending, name)
			continue
		}
		out = append(out, s)
	}
	m.mu.Unlock()
	for _, u := range act {
		out = append(out, u.Status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Object < out[j].Object })
	return append(out, ended...)
}

// Sending reports whether some upload is sending or has bytes to send and is not waiting
// out a failure.
func (m *Manager) Sending() bool {
	m.mu.Lock()
	act := make([]*Upload, 0, len(m.active))
	for _, u := range m.active {
		act = append(act, u)
	}
	m.mu.Unlock()
	for _, u := range act {
		if st := u.Status(); st.State == StateUploading && (st.LagBytes > 0 || st.FinalSize >= 0) {
			return true
		}
	}
	return false
}

// CopiedBytes are the bytes of parts re-created from an earlier object of their stream
// (a resumed capture whose local bytes were freed), all uploads.
func (m *Manager) CopiedBytes() uint64 { return m.copied.Load() }

// ReadBackParts is how many parts had their CRC32C read back from the disk rather than
// taken from the writer's record (UseCRCs), all uploads.
func (m *Manager) ReadBackParts() uint64 { return m.readBack.Load() }

// Totals are the bytes the server acknowledged and the failed attempts, all uploads.
func (m *Manager) Totals() (bytes, errs uint64) { return m.uploaded.Load(), m.errs.Load() }

// Wait blocks until no upload is active or ctx ends; it reports whether none is.
func (m *Manager) Wait(ctx context.Context) bool {
	for {
		m.mu.Lock()
		n := len(m.active)
		m.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops every upload where it is: what was acknowledged is in the state files, and a
// restarted strapd goes on from there.
func (m *Manager) Close() error {
	m.cancel()
	m.wg.Wait()
	return nil
}

// statePath is where an upload's state file lives.
func (m *Manager) statePath(st *State) string {
	return filepath.Join(m.o.StateDir, stateName(st.Dev, st.Ino))
}

// sameFile reports whether path is still the regular file dev/ino (deletion checks it).
func sameFile(path string, dev, ino uint64) bool {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false
	}
	return uint64(st.Dev) == dev && st.Ino == ino && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// trimErr keeps an error line short enough for status.
func trimErr(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}
