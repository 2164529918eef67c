package upload

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The S3 limits a multipart upload lives in.
const (
	// MinPartSize is S3's smallest part but the last.
	MinPartSize = 5 << 20
	// MaxPartSize is S3's largest part.
	MaxPartSize = 5 << 30
	// MaxParts is S3's most parts in one upload.
	MaxParts = 10000
	// partsPerStep is how many parts keep one size before the size doubles (partStart).
	partsPerStep = 1000
	// maxStateSize bounds a state file: 10,000 parts at well under 200 bytes each.
	maxStateSize = 4 << 20
	stateVersion = 1
)

// ErrBadState is returned for a state file that does not hold a valid upload state.
var ErrBadState = errors.New("bad upload state")

// Part is one uploaded part: its number, size, the server's ETag and our CRC32C of its bytes
// (base64 of the big-endian value, as S3's x-amz-checksum-crc32c).
type Part struct {
	Number int32  `json:"number"`
	Size   int64  `json:"size"`
	ETag   string `json:"etag"`
	CRC32C string `json:"crc32c"`
}

// Side is a file uploaded beside the stream once it is complete (trace, resource log, tokens).
type Side struct {
	Path string `json:"path"`
	Key  string `json:"key"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
}

// State is what survives a crash of strapd: the multipart upload of one stream file and the
// parts the server acknowledged. It lives in the state directory as upload-DEV-INO.json (the
// stream file's device and inode), written atomically after each part.
type State struct {
	Version int    `json:"version"`
	Bucket  string `json:"bucket"`
	Key     string `json:"key"`
	// UploadID is the server's multipart upload id; empty until the first part goes.
	UploadID string `json:"upload_id"`
	// PartSize is the first parts' size; later ones double every 1000 parts (partStart).
	PartSize int64 `json:"part_size"`
	// Path, Dev and Ino name the local stream file; a restarted strapd reopens Path only
	// when it is still that inode.
	Path string `json:"path"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	// UID owns the capture (status shows the upload to it and to root only).
	UID uint32 `json:"uid"`
	// FinalSize is the stream's size once its session ended (the file will not change
	// again); -1 while it is being written.
	FinalSize int64 `json:"final_size"`
	// KeepLocal: keep the local files once the objects are complete and verified.
	KeepLocal bool   `json:"keep_local"`
	Sides     []Side `json:"sides"`
	// Stale are keys beside the object that an earlier upload of this capture left and
	// this one deletes once the object is complete (Upload.RemoveBeside).
	Stale []string `json:"stale,omitempty"`
	// Parts are the full parts uploaded, numbered 1..len(Parts) in file order.
	Parts []Part `json:"parts"`
	// FreedFrom and FreedTo are the stream's bytes freed on the local disk after their
	// upload (Options.FreeLocal; 0, 0: none). Recorded before the hole is punched, they
	// lie inside the parts above: those parts can never be sent again.
	FreedFrom int64 `json:"freed_from,omitempty"`
	FreedTo   int64 `json:"freed_to,omitempty"`
	// Completing records, before CompleteMultipartUpload is sent, that the object is being
	// completed from Parts and Tail: a strapd killed between the server completing it and
	// strapd recording that finds the multipart upload gone after its restart, and
	// verifies the object against these parts (size, composite CRC32C) before taking it
	// for missing. Tail is the last part, shorter than a full one (nil when the stream
	// ends on a part boundary); it is sent, and recorded, only once the stream has ended.
	Completing bool  `json:"completing,omitempty"`
	Tail       *Part `json:"tail,omitempty"`
	// Completed is the ETag of the object once completed and verified, for a state kept
	// after completion: a session that did not end complete, whose local stream was freed
	// behind its upload. Its resume on this host goes on from it (Source).
	Completed string `json:"completed,omitempty"`
	// Source is that earlier object of this stream while a resumed capture's new multipart
	// upload re-creates its parts holding freed bytes from it (Copy): UploadPartCopy, or
	// read back through strapd where the server's copy cannot be checked.
	Source *Source `json:"source,omitempty"`
	// Copy are the Source parts still to re-create, numbered on from Parts.
	Copy []Part `json:"copy,omitempty"`
	// Capture is the capture's identity (captureID: a hash of the stream's header, the same
	// for every session of one capture), also the object's x-amz-meta-strap-capture: an
	// object at the key is overwritten only when it holds the same capture.
	Capture string `json:"capture,omitempty"`
	// Sweep: a CreateMultipartUpload was sent whose answer was never recorded (a server
	// that did not answer in time, strapd killed): the server may hold a multipart upload
	// of the key that nobody will complete; the upload aborts the key's others once its
	// object is complete.
	Sweep bool `json:"sweep,omitempty"`
}

// Source is an object completed from an earlier session of the stream (State.Source).
type Source struct {
	// UploadID is its multipart upload; Parts (with the tail) and Size what it was
	// completed from.
	UploadID string `json:"upload_id"`
	Size     int64  `json:"size"`
	Parts    []Part `json:"parts"`
	// ETag is the object's once verified; empty: its completion is to be finished
	// first (the resume came while it was being completed).
	ETag string `json:"etag,omitempty"`
}

// objectParts are the parts of the object as completed: Parts, then Tail.
func (s *State) objectParts() []Part {
	parts := append([]Part(nil), s.Parts...)
	if s.Tail != nil {
		parts = append(parts, *s.Tail)
	}
	return parts
}

// dropCompletion forgets the completion (the multipart upload is started anew, or a
// resumed capture goes on writing).
func (s *State) dropCompletion() { s.Completing, s.Tail = false, nil }

// status is what the state file says of its upload, as status shows it.
func (s *State) status(state string) Status {
	return Status{Object: ObjectURL(s.Bucket, s.Key), Path: s.Path, UID: s.UID, State: state, FinalSize: s.FinalSize,
		Parts: len(s.Parts), UploadedBytes: s.uploaded(), FreedBytes: s.FreedTo - s.FreedFrom}
}

// partStart is the offset of part n (1-based) for a first part size base: sizes double
// every 1000 parts, so 10,000 parts reach S3's 5 TiB object limit from base 16 MiB while
// small captures still upload in small steps. A part never exceeds MaxPartSize.
func partStart(base int64, n int32) int64 {
	var off int64
	size := base
	for i := int32(1); i < n; i++ {
		off += size
		if i%partsPerStep == 0 && size*2 <= MaxPartSize {
			size *= 2
		}
	}
	return off
}

// partSize is the full size of part n.
func partSize(base int64, n int32) int64 { return partStart(base, n+1) - partStart(base, n) }

// ParseState reads a state file's bytes and checks every field: the file is strapd's own,
// but it comes from disk, and a wrong part list would complete a wrong object.
func ParseState(b []byte) (*State, error) {
	if len(b) > maxStateSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrBadState, len(b), maxStateSize)
	}
	var s State
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrBadState)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	return &s, nil
}

func (s *State) check() error {
	if s.Version != stateVersion {
		return fmt.Errorf("version %d, expected %d", s.Version, stateVersion)
	}
	if err := checkBucket(s.Bucket); err != nil {
		return err
	}
	if err := checkKey(s.Key); err != nil {
		return err
	}
	if len(s.UploadID) > 1024 || strings.ContainsAny(s.UploadID, "\x00\r\n") {
		return errors.New("upload_id too long or holds control characters")
	}
	if s.PartSize < MinPartSize || s.PartSize > MaxPartSize {
		return fmt.Errorf("part_size %d outside %d..%d", s.PartSize, MinPartSize, MaxPartSize)
	}
	if !filepath.IsAbs(s.Path) || len(s.Path) > unix.PathMax || strings.ContainsRune(s.Path, 0) {
		return fmt.Errorf("path %q is not an absolute path", s.Path)
	}
	if s.FinalSize < -1 {
		return fmt.Errorf("final_size %d", s.FinalSize)
	}
	if len(s.Parts) > MaxParts {
		return fmt.Errorf("%d parts, at most %d", len(s.Parts), MaxParts)
	}
	if len(s.Parts) > 0 && s.UploadID == "" {
		return errors.New("parts without an upload_id")
	}
	for i, p := range s.Parts {
		if p.Number != int32(i+1) {
			return fmt.Errorf("part %d numbered %d: parts must be 1..n in order", i+1, p.Number)
		}
		if want := partSize(s.PartSize, p.Number); p.Size != want {
			return fmt.Errorf("part %d has %d bytes, expected %d", p.Number, p.Size, want)
		}
		if s.FinalSize >= 0 && partStart(s.PartSize, p.Number)+p.Size > s.FinalSize {
			return fmt.Errorf("part %d ends past final_size %d", p.Number, s.FinalSize)
		}
		if err := p.checkTags(); err != nil {
			return err
		}
	}
	if s.Tail != nil && !s.Completing {
		return errors.New("a tail part without completing")
	}
	if s.Completing {
		if s.FinalSize < 0 || s.UploadID == "" {
			return errors.New("completing without a final size and an upload_id")
		}
		end := s.uploaded()
		if t := s.Tail; t != nil {
			if t.Number != int32(len(s.Parts)+1) || t.Size <= 0 || t.Size > partSize(s.PartSize, t.Number) {
				return fmt.Errorf("tail part %d of %d bytes: expected part %d of 1..%d bytes", t.Number, t.Size, len(s.Parts)+1, partSize(s.PartSize, int32(len(s.Parts)+1)))
			}
			if err := t.checkTags(); err != nil {
				return err
			}
			end += t.Size
		}
		if end != s.FinalSize {
			return fmt.Errorf("completing parts that end at %d, the stream at %d", end, s.FinalSize)
		}
	}
	if s.FreedFrom < 0 || s.FreedTo < s.FreedFrom || s.FreedFrom%4096 != 0 || s.FreedTo%4096 != 0 || (s.FreedFrom == 0) != (s.FreedTo == 0) {
		return fmt.Errorf("freed range [%d, %d): expected 4 KiB multiples, from < to, or both 0", s.FreedFrom, s.FreedTo)
	}
	if s.Completed != "" && (!s.Completing || len(s.Completed) > 256 || strings.ContainsAny(s.Completed, "\x00\r\n")) {
		return errors.New("completed without completing, or a bad etag")
	}
	covered := s.uploaded()
	for i, p := range s.Copy {
		if p.Number != int32(len(s.Parts)+i+1) || p.Size != partSize(s.PartSize, p.Number) {
			return fmt.Errorf("copied part %d: expected part %d of %d bytes", p.Number, len(s.Parts)+i+1, partSize(s.PartSize, p.Number))
		}
		if err := p.checkTags(); err != nil {
			return err
		}
		covered += p.Size
	}
	if s.FinalSize >= 0 && covered > s.FinalSize {
		return fmt.Errorf("parts to copy end at %d, past final_size %d", covered, s.FinalSize)
	}
	if len(s.Copy) > 0 && s.Source == nil {
		return errors.New("parts to copy without a source")
	}
	if src := s.Source; src != nil {
		if s.Completing || s.Completed != "" {
			return errors.New("a source while completing")
		}
		if src.UploadID == "" || len(src.UploadID) > 1024 || strings.ContainsAny(src.UploadID, "\x00\r\n") ||
			len(src.ETag) > 256 || strings.ContainsAny(src.ETag, "\x00\r\n") {
			return errors.New("source: bad upload_id or etag")
		}
		if len(src.Parts) == 0 || len(src.Parts) > MaxParts {
			return fmt.Errorf("source of %d parts", len(src.Parts))
		}
		var end int64
		for i, p := range src.Parts {
			if p.Number != int32(i+1) || p.Size <= 0 || p.Size > partSize(s.PartSize, p.Number) ||
				(i < len(src.Parts)-1 && p.Size != partSize(s.PartSize, p.Number)) {
				return fmt.Errorf("source part %d numbered %d of %d bytes", i+1, p.Number, p.Size)
			}
			if err := p.checkTags(); err != nil {
				return err
			}
			end += p.Size
		}
		if end != src.Size {
			return fmt.Errorf("source parts end at %d, its size is %d", end, src.Size)
		}
		for i, p := range s.Copy {
			if q := src.Parts[min(int(p.Number), len(src.Parts))-1]; q.Number != p.Number || q.Size != p.Size || q.CRC32C != p.CRC32C {
				return fmt.Errorf("copied part %d is not the source's", i+1)
			}
		}
	}
	if s.FreedTo > covered {
		return fmt.Errorf("freed range ends at %d, past the parts uploaded (%d bytes)", s.FreedTo, covered)
	}
	if len(s.Sides) > 16 {
		return fmt.Errorf("%d side files, at most 16", len(s.Sides))
	}
	for _, sd := range s.Sides {
		if !filepath.IsAbs(sd.Path) || len(sd.Path) > unix.PathMax || strings.ContainsRune(sd.Path, 0) {
			return fmt.Errorf("side file path %q is not an absolute path", sd.Path)
		}
		if err := checkKey(sd.Key); err != nil {
			return err
		}
	}
	if len(s.Capture) > 64 || strings.Trim(s.Capture, "0123456789abcdef") != "" {
		return fmt.Errorf("capture %q: expected at most 64 lowercase hex digits", s.Capture)
	}
	if len(s.Stale) > 16 {
		return fmt.Errorf("%d stale keys, at most 16", len(s.Stale))
	}
	for _, k := range s.Stale {
		if err := checkKey(k); err != nil {
			return err
		}
	}
	return nil
}

// checkTags checks a part's ETag and CRC32C as a state file holds them.
func (p Part) checkTags() error {
	if p.ETag == "" || len(p.ETag) > 256 || strings.ContainsAny(p.ETag, "\x00\r\n") {
		return fmt.Errorf("part %d: bad etag", p.Number)
	}
	if c, err := base64.StdEncoding.DecodeString(p.CRC32C); err != nil || len(c) != 4 {
		return fmt.Errorf("part %d: crc32c %q is not 4 bytes in base64", p.Number, p.CRC32C)
	}
	return nil
}

// checkKey: S3 keys are 1..1024 bytes of UTF-8; strapd's never hold control characters.
func checkKey(k string) error {
	if k == "" || len(k) > 1024 {
		return fmt.Errorf("key of %d bytes, expected 1..1024", len(k))
	}
	for _, c := range k {
		if c < 0x20 || c == 0x7f || c == 0xfffd {
			return fmt.Errorf("key %q holds a control or invalid character", k)
		}
	}
	return nil
}

// StateName is the name of the state file of an upload of the file fi describes.
func StateName(fi os.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return stateName(uint64(st.Dev), st.Ino)
}

// stateName is the state file's name for a stream file's device and inode.
func stateName(dev, ino uint64) string { return fmt.Sprintf("upload-%d-%d.json", dev, ino) }

// save writes the state atomically: a temporary file, fsync, rename, fsync of the directory.
func (s *State) save(dir string) error {
	_, err := s.write(dir)
	return err
}

// write is save, returning the bytes written.
func (s *State) write(dir string) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return b, writeState(dir, stateName(s.Dev, s.Ino), b)
}

// writeState writes a state file's bytes atomically under name.
func writeState(dir, name string, b []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("upload state directory: %w", err)
	}
	final := filepath.Join(dir, name)
	tmp := final + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write upload state: %w", err)
	}
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, final)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write upload state: %w", werr)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// loadState reads one state file.
func loadState(path string) (*State, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := ParseState(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
