package upload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/stream"
)

// An object key is one capture's: strapd writes an object only where the key holds none,
// or holds an earlier object of the same capture (a resumed session, an upload completed
// again). The capture is named by captureID, kept in the object's user metadata.

// captureMeta is the user metadata (x-amz-meta-strap-capture) naming the capture an object
// holds.
const captureMeta = "strap-capture"

// ErrKeyTaken is an upload refused because its key holds another capture's object.
var ErrKeyTaken = errors.New("the key holds another capture's object")

// errNoHeader: the stream's header is not on the disk yet (a new capture's first bytes).
var errNoHeader = errors.New("the stream's header is not written yet")

// captureIDLen is the hex digits of a capture id (128 bits of SHA-256).
const captureIDLen = 32

// captureID names the capture a stream file holds: a hash of its header (magic, version,
// metadata: the session's start, host, peer and client, STREAM_FORMAT.md 2), which every
// resumed session keeps and no other capture shares. A file that is not a stream (strapd
// upload of any file) is named by its first 64 KiB.
func captureID(f *os.File, size int64) (string, error) {
	var h [stream.FileHeaderLen]byte
	if size < int64(len(h)) {
		if size == 0 {
			return "", errNoHeader
		}
		return hashPrefix(f, size)
	}
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return "", fmt.Errorf("read the stream's header: %w", err)
	}
	if !bytes.Equal(h[:8], []byte(stream.FileMagic)) {
		return hashPrefix(f, min(size, 64<<10))
	}
	n := int64(len(h)) + int64(binary.LittleEndian.Uint32(h[12:16]))
	if n > size {
		return "", errNoHeader
	}
	return hashPrefix(f, n)
}

func hashPrefix(f *os.File, n int64) (string, error) {
	sum := sha256.New()
	if _, err := io.Copy(sum, io.NewSectionReader(f, 0, n)); err != nil {
		return "", fmt.Errorf("read the stream's header: %w", err)
	}
	return hex.EncodeToString(sum.Sum(nil))[:captureIDLen], nil
}

// keyObject is what a key holds.
type keyObject struct {
	// Capture is the object's x-amz-meta-strap-capture ("" for an object strapd did not
	// write, or wrote before it named captures).
	Capture  string
	ETag     string
	Size     int64
	Modified time.Time
}

// probe asks what the key holds (nil: nothing), with a ranged GET of its first byte: unlike
// a HEAD, its error answer tells a missing bucket from a missing key.
func (c *Client) probe(ctx context.Context, bucket, key string, d time.Duration) (_ *keyObject, err error) {
	ctx, end := c.callWithin(ctx, "GetObject "+ObjectURL(bucket, key), d, 0)
	defer end(&err)
	out, err := c.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Range: aws.String("bytes=0-0")})
	switch code := apiCode(err); {
	case code == "NoSuchKey" || code == "NotFound":
		return nil, nil
	case code == "InvalidRange":
		return &keyObject{}, nil // an empty object: no capture's
	case err != nil:
		return nil, err
	}
	defer out.Body.Close()
	o := &keyObject{Capture: out.Metadata[captureMeta], ETag: aws.ToString(out.ETag), Modified: aws.ToTime(out.LastModified)}
	if cr := aws.ToString(out.ContentRange); cr != "" {
		fmt.Sscanf(cr[bytes.LastIndexByte([]byte(cr), '/')+1:], "%d", &o.Size)
	}
	return o, nil
}

// taken is the refusal of an upload whose key holds another capture's object.
func taken(bucket, key string, o *keyObject) error {
	whose := "an object strapd did not write (no x-amz-meta-strap-capture)"
	if o.Capture != "" {
		whose = "capture " + o.Capture
	}
	return fmt.Errorf("%w: %s holds %s (%d bytes, written %s); strapd does not overwrite it: upload to another target or file name, or delete the object first if it is no longer needed",
		ErrKeyTaken, ObjectURL(bucket, key), whose, o.Size, o.Modified.UTC().Format(time.RFC3339))
}

// Condition is a conditional write of an object (CompleteMultipartUpload): the key must
// hold no object (None: If-None-Match: *), or the object ETag (If-Match).
type Condition struct {
	None bool
	ETag string
}

func (c Condition) apply(ifNone, ifMatch **string) {
	if c.None {
		*ifNone = aws.String("*")
	} else if c.ETag != "" {
		*ifMatch = aws.String(c.ETag)
	}
}

// claim checks that the key may take this capture's object, and says how to complete it:
// the key free (If-None-Match: *) or holding this capture's earlier object (If-Match its
// ETag). An object of another capture is ErrKeyTaken.
func (u *Upload) claim(ctx context.Context) (Condition, error) {
	st := u.st
	o, err := u.m.o.Client.probe(ctx, st.Bucket, st.Key, u.m.o.Client.callTimeout(0))
	if err != nil {
		return Condition{}, fmt.Errorf("check %s before writing it: %w", u.object(), err)
	}
	if o == nil {
		return Condition{None: true}, nil
	}
	if st.Capture == "" || o.Capture != st.Capture {
		return Condition{}, taken(st.Bucket, st.Key, o)
	}
	return Condition{ETag: o.ETag}, nil
}

// knowCapture fills st.Capture from the file once its header is on the disk (before the
// first multipart upload is created: the object carries it).
func (u *Upload) knowCapture(avail int64) error {
	if u.st.Capture != "" {
		return nil
	}
	id, err := captureID(u.f, avail)
	if errors.Is(err, errNoHeader) && u.st.FinalSize > 0 {
		// Final, and its header never whole (a damaged length): named by its first bytes,
		// rather than waiting for bytes that will not come.
		id, err = hashPrefix(u.f, min(avail, 64<<10))
	}
	if err != nil {
		return err
	}
	u.st.Capture = id
	return nil
}

// sweep aborts the key's multipart uploads other than this one's: a CreateMultipartUpload
// whose answer strapd never heard (State.Sweep) may have made one that nobody completes.
// The key is this capture's (claim), so no other capture's upload is there to abort.
func (u *Upload) sweep(ctx context.Context) error {
	st := u.st
	c := u.m.o.Client
	lctx, end := c.call(ctx, "ListMultipartUploads", 0)
	out, err := c.s3.ListMultipartUploads(lctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(st.Bucket), Prefix: aws.String(st.Key)})
	end(&err)
	if err != nil {
		return fmt.Errorf("list the multipart uploads of %s: %w", u.object(), err)
	}
	n := 0
	for _, mu := range out.Uploads {
		if aws.ToString(mu.Key) != st.Key || aws.ToString(mu.UploadId) == st.UploadID {
			continue
		}
		if err := c.abort(ctx, st.Bucket, st.Key, aws.ToString(mu.UploadId)); err != nil && !notFound(err) {
			return fmt.Errorf("abort an orphaned multipart upload of %s: %w", u.object(), err)
		}
		n++
	}
	if n > 0 {
		u.m.o.Log.Info("orphaned multipart uploads of the key aborted (made by requests whose answer strapd never heard)",
			zap.String("object", u.object()), zap.Int("aborted", n))
	}
	st.Sweep = false
	return nil
}
