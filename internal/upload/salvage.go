package upload

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// Salvage completes what a dead host's strapd left in an open multipart upload
// (`strapd salvage`, docs/OBJECT_STORAGE.md "A host that died mid-capture"). A stream's
// parts are its bytes in file order, part n at a fixed offset (partStart), so the
// contiguous parts from part 1 are a prefix of the stream as it was on that host's disk;
// completing them makes that prefix an object the readers take like a stream whose
// daemon died (no footer, a torn last packet).

// Errors of Salvage; each leaves the bucket as it was.
var (
	// ErrNotAcknowledged: completing ends the multipart upload, which a strapd still
	// running would be sending parts to; the caller must say its host is gone.
	ErrNotAcknowledged = errors.New("completing the upload ends it for the strapd that sends it: confirm that host and its strapd are gone (--host-is-gone)")
	// ErrObjectExists: the key holds an object already; salvage never replaces one.
	ErrObjectExists = errors.New("the object already exists; salvage never replaces an object")
	// ErrNoOpenUpload: the server holds no open multipart upload of the key.
	ErrNoOpenUpload = errors.New("no open multipart upload of this key")
	// ErrSeveralUploads: more than one open upload of the key, and none chosen.
	ErrSeveralUploads = errors.New("several open multipart uploads of this key: choose one with --upload-id")
	// ErrNothingToSalvage: the upload holds no part 1, so no prefix of the stream.
	ErrNothingToSalvage = errors.New("the upload holds no part 1: no prefix of the stream to complete")
)

// OpenUpload is an open (not completed, not aborted) multipart upload as the server
// lists it, with its parts.
type OpenUpload struct {
	Key       string    `json:"key"`
	UploadID  string    `json:"upload_id"`
	Initiated time.Time `json:"initiated"`
	// Parts and Bytes: every part the server holds, and their bytes.
	Parts int   `json:"parts"`
	Bytes int64 `json:"bytes"`
	// RunParts and RunBytes: the part run Salvage would complete (SalvageRun).
	RunParts int   `json:"salvageable_parts"`
	RunBytes int64 `json:"salvageable_bytes"`
	// Missing is the first part number missing after the run with later parts present
	// (0: none); those later parts cannot be part of the object.
	Missing int32 `json:"first_missing_part,omitempty"`

	parts []Part
}

// ListOpenUploads lists the open multipart uploads of keys under prefix (every key
// starting with it; exact: only the key equal to prefix), oldest first, each with its parts.
func (c *Client) ListOpenUploads(ctx context.Context, bucket, prefix string, exact bool) ([]OpenUpload, error) {
	var ups []OpenUpload
	p := s3.NewListMultipartUploadsPaginator(c.s3, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list the open multipart uploads under %s: %s", ObjectURL(bucket, prefix), Describe(err))
		}
		for _, u := range page.Uploads {
			key, id := aws.ToString(u.Key), aws.ToString(u.UploadId)
			if id == "" || !strings.HasPrefix(key, prefix) || exact && key != prefix {
				continue
			}
			ups = append(ups, OpenUpload{Key: key, UploadID: id, Initiated: aws.ToTime(u.Initiated)})
		}
	}
	for i := range ups {
		u := &ups[i]
		have, err := c.listParts(ctx, bucket, u.Key, u.UploadID)
		if err != nil {
			if notFound(err) {
				continue // completed or aborted since it was listed: no parts left
			}
			return nil, fmt.Errorf("list the parts of upload %s of %s: %s", u.UploadID, ObjectURL(bucket, u.Key), Describe(err))
		}
		u.parts = make([]Part, 0, len(have))
		for _, sp := range have {
			pt := Part{Number: aws.ToInt32(sp.PartNumber), Size: aws.ToInt64(sp.Size), ETag: aws.ToString(sp.ETag),
				CRC32C: aws.ToString(sp.ChecksumCRC32C)}
			u.parts = append(u.parts, pt)
			u.Parts++
			u.Bytes += pt.Size
		}
		sort.Slice(u.parts, func(a, b int) bool { return u.parts[a].Number < u.parts[b].Number })
		run, missing := SalvageRun(u.parts)
		u.RunParts, u.Missing = len(run), missing
		for _, pt := range run {
			u.RunBytes += pt.Size
		}
	}
	sort.SliceStable(ups, func(a, b int) bool { return ups[a].Initiated.Before(ups[b].Initiated) })
	return ups, nil
}

// SalvageRun is the longest run of parts numbered 1, 2, 3... in parts (sorted by number)
// that makes a prefix of the stream: it stops at the first missing number, and after a
// part smaller than the one before it or than the minimum part size (strapd's parts only
// grow, so a smaller one was the stream's last bytes when it was sent, and whatever
// follows it cannot continue it). missing is the first part number absent after the run
// while a later part is present, else 0.
func SalvageRun(parts []Part) (run []Part, missing int32) {
	next := int32(1)
	final := false // the last part taken ends the stream's prefix
	for _, p := range parts {
		if p.Number < next {
			continue // a repeat (not from a server, but never taken twice)
		}
		if final || p.Size <= 0 {
			return run, 0
		}
		if p.Number != next {
			return run, next
		}
		final = p.Size < MinPartSize || len(run) > 0 && p.Size < run[len(run)-1].Size
		run = append(run, p)
		next++
	}
	return run, 0
}

// SalvageOptions choose what Salvage completes.
type SalvageOptions struct {
	// UploadID picks one of several open uploads of the key ("": there must be one).
	UploadID string
	// HostIsGone acknowledges that the strapd that sent the upload is not running.
	HostIsGone bool
}

// Salvaged is what Salvage completed.
type Salvaged struct {
	Object   string `json:"object"`
	UploadID string `json:"upload_id"`
	// Parts and Bytes: the parts completed into the object, and its size.
	Parts int   `json:"parts"`
	Bytes int64 `json:"bytes"`
	// LeftParts and LeftBytes: parts the upload held beyond the run (after a gap or a
	// short part), dropped with the upload.
	LeftParts int   `json:"parts_left_out"`
	LeftBytes int64 `json:"bytes_left_out"`
	// Verified says what was checked of the completed object.
	Verified string `json:"verified"`
}

// Salvage completes the open multipart upload of bucket/key from its contiguous parts
// from part 1 (SalvageRun), only when the key holds no object, the upload is the only one
// of the key (or chosen), and the caller acknowledged the host is gone; the object is
// then checked (size, and the parts' CRC32C where the server keeps the object's).
func (c *Client) Salvage(ctx context.Context, bucket, key string, o SalvageOptions) (Salvaged, error) {
	object := ObjectURL(bucket, key)
	if key == "" {
		return Salvaged{}, fmt.Errorf("%s names a bucket, not an object", object)
	}
	if err := c.noObject(ctx, bucket, key); err != nil {
		return Salvaged{}, err
	}
	ups, err := c.ListOpenUploads(ctx, bucket, key, true)
	if err != nil {
		return Salvaged{}, err
	}
	var u *OpenUpload
	switch {
	case o.UploadID != "":
		for i := range ups {
			if ups[i].UploadID == o.UploadID {
				u = &ups[i]
			}
		}
		if u == nil {
			return Salvaged{}, fmt.Errorf("%s: %w with id %s (%s)", object, ErrNoOpenUpload, o.UploadID, describeUploads(ups))
		}
	case len(ups) == 0:
		return Salvaged{}, fmt.Errorf("%s: %w (nothing to salvage: a completed capture is an object, an aborted upload is gone)", object, ErrNoOpenUpload)
	case len(ups) > 1:
		return Salvaged{}, fmt.Errorf("%s: %w: %s", object, ErrSeveralUploads, describeUploads(ups))
	default:
		u = &ups[0]
	}
	run, _ := SalvageRun(u.parts)
	if len(run) == 0 {
		return Salvaged{}, fmt.Errorf("%s: upload %s: %w (%d parts held)", object, u.UploadID, ErrNothingToSalvage, u.Parts)
	}
	if !o.HostIsGone {
		return Salvaged{}, fmt.Errorf("%s: would complete upload %s from its parts 1..%d (%d bytes): %w", object, u.UploadID,
			len(run), u.RunBytes, ErrNotAcknowledged)
	}
	withCRC := true
	for _, p := range run {
		withCRC = withCRC && p.CRC32C != ""
	}
	cp := make([]types.CompletedPart, len(run))
	for i, p := range run {
		cp[i] = types.CompletedPart{PartNumber: aws.Int32(p.Number), ETag: aws.String(p.ETag)}
		if withCRC {
			cp[i].ChecksumCRC32C = aws.String(p.CRC32C)
		}
	}
	// If-None-Match: a store that implements conditional writes refuses to complete over
	// an object written since noObject looked.
	_, err = c.s3.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(u.UploadID), IfNoneMatch: aws.String("*"),
		MultipartUpload: &types.CompletedMultipartUpload{Parts: cp}})
	if err != nil {
		if apiCode(err) == "PreconditionFailed" {
			return Salvaged{}, fmt.Errorf("%s: %w (written while salvaging)", object, ErrObjectExists)
		}
		return Salvaged{}, fmt.Errorf("complete upload %s of %s: %s", u.UploadID, object, Describe(err))
	}
	res := Salvaged{Object: object, UploadID: u.UploadID, Parts: len(run), Bytes: u.RunBytes,
		LeftParts: u.Parts - len(run), LeftBytes: u.Bytes - u.RunBytes}
	checked := run
	if !withCRC {
		checked = nil // nothing to compare but the size
	}
	_, res.Verified, err = c.checkObject(ctx, bucket, key, u.RunBytes, checked, true)
	if err != nil {
		return res, fmt.Errorf("the upload was completed, but: %w", err)
	}
	if !withCRC {
		res.Verified = "size (the parts carry no CRC32C: not an upload strapd sent)"
	}
	return res, nil
}

// noObject is nil when bucket/key holds no object, ErrObjectExists when it does.
func (c *Client) noObject(ctx context.Context, bucket, key string) error {
	size, _, _, err := c.head(ctx, bucket, key)
	switch {
	case err == nil:
		return fmt.Errorf("%s (%d bytes): %w", ObjectURL(bucket, key), size, ErrObjectExists)
	case notFound(err):
		return nil
	}
	return fmt.Errorf("look for an object at %s: %s", ObjectURL(bucket, key), Describe(err))
}

// describeUploads names open uploads for an error: id, initiation time, parts, bytes.
func describeUploads(ups []OpenUpload) string {
	if len(ups) == 0 {
		return "there is none"
	}
	s := make([]string, len(ups))
	for i, u := range ups {
		s[i] = fmt.Sprintf("upload %s initiated %s, %d parts, %d bytes (%d salvageable)", u.UploadID,
			u.Initiated.UTC().Format(time.RFC3339), u.Parts, u.Bytes, u.RunBytes)
	}
	return strings.Join(s, "; ")
}
