package upload

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"golang.org/x/sys/unix"
)

// Parts over plain HTTP go out by sendfile(2): the SDK wraps every request body in readers
// of its own, so through s3.UploadPart the part's bytes are read into user space and
// written to the socket (two copies, and the read-back of bytes the capture wrote with
// O_DIRECT comes from the disk into cold memory: PERFORMANCE.md "Upload to object
// storage"). A presigned UploadPart sent with net/http whose body is an *os.File of known
// length is written by the transport through TCPConn.ReadFrom, which is sendfile: the
// kernel sends the page cache's pages without a copy through strapd.
//
// Over HTTPS the bytes must be encrypted in user space anyway, so the SDK path stays.
// STRAP_UPLOAD_SENDFILE=0 turns the sendfile path off (an A/B switch for bench-upload, and
// a way out should a server refuse presigned parts).

// sendfileEnabled is read once: the environment of the daemon.
var sendfileEnabled = os.Getenv("STRAP_UPLOAD_SENDFILE") != "0"

// writerCRCsEnabled: STRAP_UPLOAD_CRC=readback reads every part back for its CRC32C even
// where the writer recorded it (Upload.UseCRCs): the A/B switch of bench-upload.
var writerCRCsEnabled = os.Getenv("STRAP_UPLOAD_CRC") != "readback"

// presignExpiry bounds a presigned part's validity: it is used at once, once.
const presignExpiry = 15 * time.Minute

// maxErrorBody is how much of an error response is read for its code and message.
const maxErrorBody = 64 << 10

// uploadPartSendfile sends part n from f's bytes [off, off+size) with a presigned request.
// handled is false when the endpoint is not plain HTTP (the caller uses the SDK).
func (c *Client) uploadPartSendfile(ctx context.Context, bucket, key, id string, n int32, f *os.File, off, size int64, crc string) (etag string, handled bool, err error) {
	ps, err := c.presign.PresignUploadPart(ctx, &s3.UploadPartInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(id), PartNumber: aws.Int32(n),
		ContentLength: aws.Int64(size), ChecksumCRC32C: aws.String(crc)}, s3.WithPresignExpires(presignExpiry))
	if err != nil {
		return "", true, err
	}
	u, err := url.Parse(ps.URL)
	if err != nil {
		return "", true, fmt.Errorf("presigned part URL: %w", err)
	}
	if u.Scheme != "http" {
		return "", false, nil
	}
	body, err := newPartBody(f, off, size)
	if err != nil {
		return "", true, err
	}
	defer body.Close()
	// A body of known length: the transport wraps it in an io.LimitedReader only, which
	// TCPConn.ReadFrom sends with sendfile (partBody is a syscall.Conn).
	etag, err = c.sendPresignedPart(ctx, ps.Method, ps.URL, ps.SignedHeader, n, body, size, crc)
	return etag, true, err
}

// uploadPartPresigned sends part n from body (size bytes) with a presigned request, over
// HTTP or HTTPS: a body that is not a file (seekable) the SDK's own UploadPart refuses
// without TLS.
func (c *Client) uploadPartPresigned(ctx context.Context, bucket, key, id string, n int32, body io.Reader, size int64, crc string) (string, error) {
	ps, err := c.presign.PresignUploadPart(ctx, &s3.UploadPartInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(id), PartNumber: aws.Int32(n),
		ContentLength: aws.Int64(size), ChecksumCRC32C: aws.String(crc)}, s3.WithPresignExpires(presignExpiry))
	if err != nil {
		return "", err
	}
	return c.sendPresignedPart(ctx, ps.Method, ps.URL, ps.SignedHeader, n, body, size, crc)
}

// sendPresignedPart sends a presigned UploadPart with its body and CRC32C.
func (c *Client) sendPresignedPart(ctx context.Context, method, rawURL string, signed http.Header, n int32, body io.Reader, size int64, crc string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, method, rawURL, body)
	if err != nil {
		return "", err
	}
	req.ContentLength = size
	for k, v := range signed {
		if !strings.EqualFold(k, "Host") && !strings.EqualFold(k, "Content-Length") {
			req.Header[k] = v
		}
	}
	// The server checks the part's bytes against this CRC32C (signed when the presigner
	// signed it; S3 takes an x-amz-checksum header either way).
	req.Header.Set("X-Amz-Checksum-Crc32c", crc)
	resp, err := c.http.Do(req)
	if err != nil {
		// Not the presigned URL in the message: long, and it carries a signature.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("send part %d: %w", n, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", responseError(resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody)) // keep the connection
	if got := resp.Header.Get("X-Amz-Checksum-Crc32c"); got != "" && got != crc {
		return "", fmt.Errorf("part %d: the server stored CRC32C %s, the bytes sent have %s", n, got, crc)
	}
	etag := resp.Header.Get("ETag")
	if etag == "" {
		return "", fmt.Errorf("part %d: the server returned no ETag", n)
	}
	return etag, nil
}

// partBody is a part's bytes as a request body: a file description of its own, at the
// part's start. It is a syscall.Conn, so net's sendfile takes it; Read (which the
// transport uses to check that no bytes follow the Content-Length it sent, and which
// serves any writer that is not a socket) stops at the part's end, wherever sendfile
// left the file offset.
type partBody struct {
	f   *os.File
	end int64
}

func newPartBody(f *os.File, off, size int64) (*partBody, error) {
	g, err := openAt(f, off)
	if err != nil {
		return nil, err
	}
	return &partBody{f: g, end: off + size}, nil
}

func (b *partBody) Read(p []byte) (int, error) {
	off, err := b.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	if off >= b.end {
		return 0, io.EOF
	}
	if rest := b.end - off; int64(len(p)) > rest {
		p = p[:rest]
	}
	return b.f.Read(p)
}

func (b *partBody) SyscallConn() (syscall.RawConn, error) { return b.f.SyscallConn() }

func (b *partBody) Close() error { return b.f.Close() }

// openAt opens a new file description of f (through /proc/self/fd: its own file offset,
// which sendfile advances, so parts sent at once do not share one) positioned at off.
func openAt(f *os.File, off int64) (*os.File, error) {
	p := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen %s for sending: %w", f.Name(), err)
	}
	g := os.NewFile(uintptr(fd), f.Name())
	if _, err := g.Seek(off, io.SeekStart); err != nil {
		g.Close()
		return nil, fmt.Errorf("seek %s: %w", f.Name(), err)
	}
	return g, nil
}

// s3ErrorBody is the XML body of an S3 error response.
type s3ErrorBody struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

// responseError turns a failed response into the API error the SDK would have returned,
// so that Describe, permanent and notFound judge it alike.
func responseError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return parseErrorResponse(resp.StatusCode, resp.Status, b)
}

// parseErrorResponse parses an S3 error body (<Error><Code>…</Code><Message>…</Message>);
// a body without a code is named by the HTTP status.
func parseErrorResponse(status int, statusText string, body []byte) error {
	var e s3ErrorBody
	if err := xml.Unmarshal(body, &e); err != nil || e.Code == "" {
		code := http.StatusText(status)
		switch status {
		case http.StatusNotFound:
			code = "NotFound"
		case http.StatusForbidden:
			code = "Forbidden"
		}
		if code == "" {
			code = fmt.Sprintf("HTTP%d", status)
		}
		return &smithy.GenericAPIError{Code: strings.ReplaceAll(code, " ", ""), Message: "HTTP " + statusText}
	}
	return &smithy.GenericAPIError{Code: e.Code, Message: e.Message}
}
