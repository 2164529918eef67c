package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/checkpoint"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline"
	"github.com/strap-llm/strap/internal/upload"
)

// Uploads configures uploads to object storage (internal/upload, OBJECT_STORAGE.md).
type Uploads struct {
	// Manager runs them; nil: uploads are unavailable (Err says why, when known).
	Manager *upload.Manager
	Err     error
	// Default is serve --upload: where every session's stream goes unless OPEN names
	// another target, under a component of the session's user (userSegment: users sharing
	// the daemon never share a key); nil: only sessions that name one upload.
	Default *upload.Target
	// Endpoint is the S3 endpoint in use (status only).
	Endpoint string
	// Allowed are the targets any client may name in OPEN (Default among them); a client
	// running as strapd's own user may name any.
	Allowed []upload.Target
}

// sessionUpload is the upload of one session's stream and the side files it uploads with it.
type sessionUpload struct {
	u     *upload.Upload
	path  string // the stream's
	uid   uint32 // the session's owner
	sides []upload.SideFile
}

// beginUpload starts the upload of a session's stream when OPEN or the daemon asks for
// one: it reopens the output, trace and resource log read-only through /proc/self/fd (the
// client's descriptors may be write-only) and begins (or continues) the multipart upload.
func (c *conn) beginUpload(req control.Open, outFD int, sideFDs []int, id uint64) (*sessionUpload, error) {
	cfg := &c.srv.cfg.Uploads
	var target upload.Target
	switch {
	case req.Upload != "":
		t, err := upload.ParseURL(req.Upload)
		if err != nil {
			return nil, perr(control.CodeBadMessage, "upload: %v", err)
		}
		if !c.mayUploadTo(t) {
			return nil, perr(control.CodeUploadRefused, "upload to %s refused: a client of another user may only name a target under serve --upload or --upload-allow", t)
		}
		target = t
	case cfg.Default != nil:
		target = cfg.Default.Sub(userSegment(c.cred.Uid))
	case req.UploadFreeLocal:
		return nil, perr(control.CodeBadMessage, "upload_free_local without an upload: name one with \"upload\" (this strapd has no serve --upload)")
	default:
		return nil, nil
	}
	if cfg.Manager == nil {
		why := "this strapd has no object storage configured"
		if cfg.Err != nil {
			why = cfg.Err.Error()
		}
		return nil, perr(control.CodeUploadRefused, "upload to %s: %s", target, why)
	}
	rf, path, err := reopenReadOnly(outFD)
	if err != nil {
		return nil, perr(control.CodeUploadRefused, "upload needs to read the stream back: %v (make the file readable by strapd's user, or open it O_RDWR)", err)
	}
	var punch *os.File
	freeLocal := cfg.Manager.FreeLocal() || req.UploadFreeLocal
	if freeLocal {
		// A descriptor that may punch holes: the client's own (read-only rf cannot).
		nfd, err := unix.FcntlInt(uintptr(outFD), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			rf.Close()
			return nil, perr(control.CodeUploadRefused, "upload with --upload-free-local: duplicate the output descriptor: %v", err)
		}
		punch = os.NewFile(uintptr(nfd), path)
	}
	u, err := cfg.Manager.Begin(upload.Stream{File: rf, Path: path, Target: target, AppendAt: int64(req.AppendAt), Session: id, UID: c.cred.Uid,
		FreeLocal: freeLocal, Punch: punch})
	if err != nil {
		rf.Close()
		if punch != nil {
			punch.Close()
		}
		return nil, perr(control.CodeUploadRefused, "upload to %s: %v", target, err)
	}
	su := &sessionUpload{u: u, path: path, uid: c.cred.Uid}
	for _, fd := range sideFDs {
		f, p, err := reopenReadOnly(fd)
		if err != nil {
			c.log.Warn("a side file cannot be read back and is not uploaded", zap.Uint64("session", id), zap.Error(err))
			continue
		}
		su.sides = append(su.sides, upload.SideFile{File: f, Path: p})
	}
	return su, nil
}

// userSegment is the key component of a user under the daemon's target: the user's name
// when the password database has one that is a plain key segment, else "uid-N".
func userSegment(uid uint32) string {
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil && plainSegment(u.Username) {
		return u.Username
	}
	return "uid-" + strconv.FormatUint(uint64(uid), 10)
}

// plainSegment: 1..64 of [A-Za-z0-9._-], not "." or ".." (and so never "uid-" of another).
func plainSegment(s string) bool {
	if s == "" || len(s) > 64 || s == "." || s == ".." || strings.HasPrefix(s, "uid-") {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// end hands the ended session's files to the upload. A session that did not end complete
// may be resumed, on this host or, from the object, on another: its checkpoint goes beside
// the object. One that ended complete has no checkpoint (the client deletes it after
// CLOSED), and one an earlier, aborted upload of it left beside the object is deleted.
func (su *sessionUpload) end(status string, log *zap.Logger) error {
	name := filepath.Base(checkpoint.DefaultPath(su.path))
	if status == pipeline.StatusComplete {
		su.u.RemoveBeside(name)
	} else {
		su.u.KeepLocal() // a resume needs it
		switch f, err := openCheckpoint(checkpoint.DefaultPath(su.path), su.uid); {
		case err == nil:
			su.sides = append(su.sides, upload.SideFile{File: f, Path: f.Name()})
		case !errors.Is(err, os.ErrNotExist):
			log.Warn("the checkpoint beside the stream is not uploaded", zap.Error(err))
		}
	}
	return su.u.Finish(su.sides)
}

// openCheckpoint opens a session's checkpoint file for its upload, as its owner could: the
// path names no symlink, the file is regular, owned by the session's user and a valid
// checkpoint (and so never /etc/shadow hard-linked beside a stream). strapd may run as root
// for clients of other users, and must not put a file they could not read into their bucket.
func openCheckpoint(path string, uid uint32) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("%s is not a regular file", path)
	case st.Uid != uid:
		err = fmt.Errorf("%s belongs to uid %d, not the session's %d", path, st.Uid, uid)
	case st.Size > checkpoint.MaxSize:
		err = fmt.Errorf("%s has %d bytes, a checkpoint at most %d", path, st.Size, checkpoint.MaxSize)
	}
	if err == nil {
		if _, err = checkpoint.Read(f, path); err == nil {
			_, err = f.Seek(0, io.SeekStart)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// mayUploadTo: strapd's own user may name any target; others only one under an allowed one.
func (c *conn) mayUploadTo(t upload.Target) bool {
	if c.cred.Uid == uint32(os.Geteuid()) {
		return true
	}
	for _, a := range c.srv.cfg.Uploads.Allowed {
		if a.Contains(t) {
			return true
		}
	}
	return false
}

// abandon drops an upload whose session did not start.
func (su *sessionUpload) abandon() {
	if su == nil {
		return
	}
	su.u.Abandon()
	for _, s := range su.sides {
		s.File.Close()
	}
}

// reopenReadOnly opens the file behind descriptor fd again, read-only, and names it. It
// must be a regular file still linked somewhere.
func reopenReadOnly(fd int) (*os.File, string, error) {
	proc := fmt.Sprintf("/proc/self/fd/%d", fd)
	path, err := os.Readlink(proc)
	if err != nil {
		return nil, "", fmt.Errorf("name the file: %w", err)
	}
	if !strings.HasPrefix(path, "/") || strings.HasSuffix(path, " (deleted)") {
		return nil, "", fmt.Errorf("the file %q has no path to upload it by", path)
	}
	nfd, err := unix.Open(proc, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("open %s read-only: %w", path, err)
	}
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Fstat(nfd, &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino || b.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(nfd)
		return nil, "", fmt.Errorf("%s is not the regular file the client passed", path)
	}
	return os.NewFile(uintptr(nfd), path), path, nil
}

// uploadStatus is the manager's uploads and totals for STATUS_REPLY.
func (s *Server) uploadStatus() (*control.UploadDaemonStatus, []control.UploadStatus) {
	cfg := &s.cfg.Uploads
	if cfg.Manager == nil && cfg.Err == nil && cfg.Default == nil {
		return nil, nil
	}
	ds := &control.UploadDaemonStatus{Endpoint: cfg.Endpoint}
	if cfg.Default != nil {
		ds.Target = cfg.Default.String()
	}
	if cfg.Err != nil {
		ds.Error = cfg.Err.Error()
	}
	m := cfg.Manager
	if m == nil {
		return ds, nil
	}
	ds.StateDir, ds.KeepLocal, ds.FreeLocal, ds.SSE = m.StateDir(), m.KeepLocal(), m.FreeLocal(), m.Client().SSE()
	ds.UploadedBytes, ds.Errors = m.Totals()
	ds.RecreatedBytes = m.CopiedBytes()
	// upload.Status is control.UploadStatus: the uploader's values are sent as they are.
	return ds, m.Status()
}

// uploading reports whether the connection's session uploads its stream.
func (c *conn) uploading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.upload != nil
}

// attachSide adds a file the client passed with CLOSE (its tokens file) to the files
// uploaded beside the stream, read back through a read-only descriptor of strapd's own.
// The client's descriptor is closed either way; a file that cannot be read is logged.
func (c *conn) attachSide(fd int) {
	defer unix.Close(fd)
	f, p, err := reopenReadOnly(fd)
	if err != nil {
		c.log.Warn("the file passed with CLOSE cannot be read back and is not uploaded", zap.Error(err))
		return
	}
	c.mu.Lock()
	c.upload.sides = append(c.upload.sides, upload.SideFile{File: f, Path: p})
	c.mu.Unlock()
}

// uploadsBusy reports whether an upload is sending now (ExitIdle waits for it).
func (s *Server) uploadsBusy() bool {
	return s.cfg.Uploads.Manager != nil && s.cfg.Uploads.Manager.Sending()
}
