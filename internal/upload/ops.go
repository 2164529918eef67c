package upload

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/strap-llm/strap/internal/crc32c"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcB64 is S3's x-amz-checksum-crc32c form of a CRC32C: base64 of its 4 big-endian bytes.
func crcB64(c uint32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], c)
	return base64.StdEncoding.EncodeToString(b[:])
}

// fileCRC is the CRC32C of f's bytes [off, off+n), read with pread into buf.
func fileCRC(f *os.File, off, n int64, buf []byte) (uint32, error) {
	var c uint32
	for n > 0 {
		b := buf
		if int64(len(b)) > n {
			b = b[:n]
		}
		k, err := f.ReadAt(b, off)
		c = crc32.Update(c, castagnoli, b[:k])
		off += int64(k)
		n -= int64(k)
		if err != nil && n > 0 {
			if err == io.EOF {
				return 0, fmt.Errorf("read %s: file ends at %d, before the part does", f.Name(), off)
			}
			return 0, fmt.Errorf("read %s: %w", f.Name(), err)
		}
	}
	return c, nil
}

// compositeCRC is what S3 reports as a multipart object's CRC32C ("COMPOSITE" type): the
// CRC32C of the parts' CRC32C values, then "-" and the number of parts.
func compositeCRC(parts []Part) (string, error) {
	var c uint32
	for _, p := range parts {
		b, err := base64.StdEncoding.DecodeString(p.CRC32C)
		if err != nil {
			return "", err
		}
		c = crc32.Update(c, castagnoli, b)
	}
	return fmt.Sprintf("%s-%d", crcB64(c), len(parts)), nil
}

// wholeCRC is the CRC32C of the object the parts make, combined from theirs (what a server
// reports as a "FULL_OBJECT" checksum).
func wholeCRC(parts []Part) (string, error) {
	var c uint32
	for i, p := range parts {
		b, err := base64.StdEncoding.DecodeString(p.CRC32C)
		if err != nil || len(b) != 4 {
			return "", fmt.Errorf("part %d: bad crc32c %q", p.Number, p.CRC32C)
		}
		pc := binary.BigEndian.Uint32(b)
		if i == 0 {
			c = pc
		} else {
			c = crc32c.Combine(c, pc, p.Size)
		}
	}
	return crcB64(c), nil
}

// rangeCRC is the CRC32C of an object's bytes [off, off+n), read with one ranged GET.
func (c *Client) rangeCRC(ctx context.Context, bucket, key string, off, n int64, buf []byte) (_ uint32, err error) {
	ctx, end := c.call(ctx, "read back "+ObjectURL(bucket, key), n)
	defer end(&err)
	out, err := c.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))})
	if err != nil {
		return 0, err
	}
	defer out.Body.Close()
	var crc uint32
	var got int64
	for {
		k, err := out.Body.Read(buf)
		crc = crc32.Update(crc, castagnoli, buf[:k])
		got += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if got != n {
		return 0, fmt.Errorf("bytes [%d, %d): the server sent %d bytes", off, off+n, got)
	}
	return crc, nil
}

func (c *Client) create(ctx context.Context, bucket, key, capture string) (_ string, err error) {
	ctx, end := c.call(ctx, "CreateMultipartUpload", 0)
	defer end(&err)
	in := &s3.CreateMultipartUploadInput{
		Bucket: aws.String(bucket), Key: aws.String(key), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		ContentType: aws.String("application/octet-stream")}
	if capture != "" {
		in.Metadata = map[string]string{captureMeta: capture}
	}
	if c.sse != "" {
		in.ServerSideEncryption = types.ServerSideEncryption(c.sse)
		if c.kmsKey != "" {
			in.SSEKMSKeyId = aws.String(c.kmsKey)
		}
	}
	out, err := c.s3.CreateMultipartUpload(ctx, in)
	if err != nil {
		return "", err
	}
	if out.UploadId == nil || *out.UploadId == "" {
		return "", fmt.Errorf("create multipart upload: the server returned no upload id")
	}
	if err := c.confirmSSE(out.ServerSideEncryption); err != nil {
		// Nothing goes into an upload that would not be encrypted.
		if aerr := c.abort(ctx, bucket, key, *out.UploadId); aerr != nil && !notFound(aerr) {
			err = errors.Join(err, fmt.Errorf("abort it: %w", aerr))
		}
		return "", err
	}
	return *out.UploadId, nil
}

// confirmSSE checks the server's answer to an object write names the encryption asked for
// (the multipart upload's parts are encrypted as the upload was created).
func (c *Client) confirmSSE(got types.ServerSideEncryption) error {
	if c.sse == "" || string(got) == c.sse {
		return nil
	}
	if got == "" {
		return fmt.Errorf("%w %s: its answer names none, so the object would not be stored encrypted (use a store that implements it, or serve without --s3-sse)", ErrSSENotConfirmed, c.sse)
	}
	return fmt.Errorf("%w %s: its answer names %s", ErrSSENotConfirmed, c.sse, got)
}

func (c *Client) uploadPart(ctx context.Context, bucket, key, id string, n int32, f *os.File, off, size int64, crc string) (_ string, err error) {
	ctx, end := c.call(ctx, fmt.Sprintf("UploadPart %d", n), size)
	defer end(&err)
	if sendfileEnabled {
		if etag, handled, err := c.uploadPartSendfile(ctx, bucket, key, id, n, f, off, size, crc); handled {
			return etag, err
		}
	}
	out, err := c.s3.UploadPart(ctx, &s3.UploadPartInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(id), PartNumber: aws.Int32(n),
		Body: io.NewSectionReader(f, off, size), ContentLength: aws.Int64(size), ChecksumCRC32C: aws.String(crc)})
	if err != nil {
		return "", err
	}
	if out.ChecksumCRC32C != nil && *out.ChecksumCRC32C != crc {
		return "", fmt.Errorf("part %d: the server stored CRC32C %s, the file's bytes have %s", n, *out.ChecksumCRC32C, crc)
	}
	if out.ETag == nil || *out.ETag == "" {
		return "", fmt.Errorf("part %d: the server returned no ETag", n)
	}
	return *out.ETag, nil
}

// listParts is every part the server holds for an upload, by number.
func (c *Client) listParts(ctx context.Context, bucket, key, id string) (_ map[int32]types.Part, err error) {
	ctx, end := c.call(ctx, "ListParts", 0)
	defer end(&err)
	parts := map[int32]types.Part{}
	p := s3.NewListPartsPaginator(c.s3, &s3.ListPartsInput{Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(id)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, pt := range page.Parts {
			if pt.PartNumber != nil {
				parts[*pt.PartNumber] = pt
			}
		}
	}
	return parts, nil
}

func (c *Client) complete(ctx context.Context, bucket, key, id string, parts []Part, cond Condition) (err error) {
	// Servers assemble the object before they answer (AWS: "could take several minutes").
	ctx, end := c.callWithin(ctx, "CompleteMultipartUpload", 10*c.floor, 0)
	defer end(&err)
	cp := make([]types.CompletedPart, len(parts))
	for i, p := range parts {
		cp[i] = types.CompletedPart{PartNumber: aws.Int32(p.Number), ETag: aws.String(p.ETag), ChecksumCRC32C: aws.String(p.CRC32C)}
	}
	in := &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(id),
		MultipartUpload: &types.CompletedMultipartUpload{Parts: cp}}
	cond.apply(&in.IfNoneMatch, &in.IfMatch)
	_, err = c.s3.CompleteMultipartUpload(ctx, in)
	return err
}

func (c *Client) abort(ctx context.Context, bucket, key, id string) (err error) {
	ctx, end := c.call(ctx, "AbortMultipartUpload", 0)
	defer end(&err)
	_, err = c.s3.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(id)})
	return err
}

// head is an object's size, ETag and, when the server keeps one, its CRC32C as S3 reports it.
func (c *Client) head(ctx context.Context, bucket, key string) (size int64, crc, etag string, err error) {
	ctx, end := c.call(ctx, "HeadObject", 0)
	defer end(&err)
	out, err := c.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		return 0, "", "", err
	}
	return aws.ToInt64(out.ContentLength), aws.ToString(out.ChecksumCRC32C), aws.ToString(out.ETag), nil
}

// copyPart makes part n of an upload from the object's own bytes [off, off+size) as they
// are while it still has ETag ifMatch (UploadPartCopy); it returns the new part's ETag and
// the CRC32C the server reports for it ("" when none).
func (c *Client) copyPart(ctx context.Context, bucket, key, id string, n int32, ifMatch string, off, size int64) (etag, crc string, err error) {
	ctx, end := c.call(ctx, fmt.Sprintf("UploadPartCopy %d", n), size)
	defer end(&err)
	out, err := c.s3.UploadPartCopy(ctx, &s3.UploadPartCopyInput{Bucket: aws.String(bucket), Key: aws.String(key),
		UploadId: aws.String(id), PartNumber: aws.Int32(n), CopySource: aws.String(copySource(bucket, key)),
		CopySourceIfMatch: aws.String(ifMatch), CopySourceRange: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+size-1))})
	if err != nil {
		return "", "", err
	}
	if out.CopyPartResult == nil || aws.ToString(out.CopyPartResult.ETag) == "" {
		return "", "", fmt.Errorf("copy part %d: the server returned no ETag", n)
	}
	return aws.ToString(out.CopyPartResult.ETag), aws.ToString(out.CopyPartResult.ChecksumCRC32C), nil
}

// copySource is x-amz-copy-source: bucket/key, the key URL-escaped except its slashes.
func copySource(bucket, key string) string {
	segs := strings.Split(key, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return bucket + "/" + strings.Join(segs, "/")
}

// uploadPartFromObject makes part n of an upload from the object's own bytes [off,
// off+size), read through strapd (a ranged GET while the object still has ETag ifMatch,
// its body streamed into a presigned UploadPart): the server checks them against crc, the
// CRC32C the part had when first sent.
func (c *Client) uploadPartFromObject(ctx context.Context, bucket, key, id string, n int32, ifMatch string, off, size int64, crc string) (_ string, err error) {
	// Read and sent again: twice the bytes.
	ctx, end := c.call(ctx, fmt.Sprintf("part %d from the earlier object", n), 2*size)
	defer end(&err)
	out, err := c.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), IfMatch: aws.String(ifMatch),
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+size-1))})
	if err != nil {
		return "", err
	}
	defer out.Body.Close()
	if aws.ToInt64(out.ContentLength) != size {
		return "", fmt.Errorf("bytes [%d, %d) of the object: the server sends %d bytes", off, off+size, aws.ToInt64(out.ContentLength))
	}
	return c.uploadPartPresigned(ctx, bucket, key, id, n, io.LimitReader(out.Body, size), size, crc)
}

// putFile uploads a whole small file as one object, with its CRC32C checked by the server.
func (c *Client) putFile(ctx context.Context, bucket, key string, f *os.File, size int64, crc string) (err error) {
	ctx, end := c.call(ctx, "PutObject "+ObjectURL(bucket, key), size)
	defer end(&err)
	in := &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
		Body: io.NewSectionReader(f, 0, size), ContentLength: aws.Int64(size), ChecksumCRC32C: aws.String(crc)}
	if c.sse != "" {
		in.ServerSideEncryption = types.ServerSideEncryption(c.sse)
		if c.kmsKey != "" {
			in.SSEKMSKeyId = aws.String(c.kmsKey)
		}
	}
	out, err := c.s3.PutObject(ctx, in)
	if err != nil {
		return err
	}
	if err := c.confirmSSE(out.ServerSideEncryption); err != nil {
		// Written, perhaps unencrypted: not left in the bucket as if it were encrypted.
		if derr := c.deleteObject(ctx, bucket, key); derr != nil && !notFound(derr) {
			err = errors.Join(err, fmt.Errorf("delete it: %w", derr))
		}
		return err
	}
	return nil
}

// deleteObject deletes one object (S3 answers a missing one as deleted; some servers with
// NoSuchKey, which the caller treats as done).
func (c *Client) deleteObject(ctx context.Context, bucket, key string) (err error) {
	ctx, end := c.call(ctx, "DeleteObject", 0)
	defer end(&err)
	_, err = c.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	return err
}

// sameETag compares ETags as servers quote them or not.
func sameETag(a, b string) bool { return strings.Trim(a, `"`) == strings.Trim(b, `"`) }

// crcBufSize is the read size of the CRC pass over a part: small enough that the bytes the
// kernel copies in are still in the CPU's cache when the CRC reads them (a 1 MiB buffer
// made that copy a third of the daemon's upload CPU, PERFORMANCE.md).
const crcBufSize = 64 << 10
