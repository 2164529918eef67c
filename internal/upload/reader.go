package upload

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// ObjectReader reads an object by byte ranges (io.ReaderAt): each read the last few spans
// fetched do not cover fetches its own range, extended to at least readAhead bytes. `strapd
// inspect` reads packet headers scattered through the object (a small read-ahead: a header
// and the small packets after it, never a large payload), `verify` reads it in order (a
// large one).
type ObjectReader struct {
	c           *Client
	ctx         context.Context
	bucket, key string
	size        int64
	readAhead   int64

	mu      sync.Mutex
	spans   []span // most recently fetched last
	fetched int64  // bytes fetched from the server
	gets    int
	err     error // the first failed fetch
}

type span struct {
	off  int64
	data []byte
}

// cachedSpans bounds the reader's memory: a few spans of about readAhead bytes each.
const cachedSpans = 4

// OpenObject finds the object's size (one HEAD) and returns a reader fetching at least
// readAhead bytes a request.
func OpenObject(ctx context.Context, c *Client, url string, readAhead int64) (*ObjectReader, error) {
	t, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if t.Prefix == "" {
		return nil, fmt.Errorf("%q names a bucket, not an object", url)
	}
	out, err := c.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(t.Bucket), Key: aws.String(t.Prefix)})
	if err != nil {
		return nil, fmt.Errorf("%s: %s", url, Describe(err))
	}
	if readAhead <= 0 {
		readAhead = 64 << 10
	}
	return &ObjectReader{c: c, ctx: ctx, bucket: t.Bucket, key: t.Prefix, size: aws.ToInt64(out.ContentLength),
		readAhead: readAhead}, nil
}

// Size is the object's size.
func (r *ObjectReader) Size() int64 { return r.size }

// Err is the first read that failed at the server or on the way (nil when none did): a
// reader of the stream sees it as a short read, which is not damage in the object.
func (r *ObjectReader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Fetched is the bytes and the number of range GETs fetched so far.
func (r *ObjectReader) Fetched() (bytes int64, gets int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fetched, r.gets
}

// ReadAt implements io.ReaderAt.
func (r *ObjectReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s: negative offset", ObjectURL(r.bucket, r.key))
	}
	if off >= r.size {
		return 0, io.EOF
	}
	want := p
	if rest := r.size - off; int64(len(want)) > rest {
		want = want[:rest]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for n < len(want) {
		cur := off + int64(n)
		if k := r.fromSpans(want[n:], cur); k > 0 {
			n += k
			continue
		}
		if err := r.fetch(cur, max(int64(len(want)-n), r.readAhead)); err != nil {
			if r.err == nil {
				r.err = err
			}
			return n, err
		}
	}
	if len(want) < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// fromSpans copies what a cached span holds at off into p.
func (r *ObjectReader) fromSpans(p []byte, off int64) int {
	for i := len(r.spans) - 1; i >= 0; i-- {
		s := r.spans[i]
		if off >= s.off && off < s.off+int64(len(s.data)) {
			return copy(p, s.data[off-s.off:])
		}
	}
	return 0
}

// fetch GETs n bytes from off (clipped to the object) into a new span.
func (r *ObjectReader) fetch(off, n int64) error {
	end := min(off+n, r.size) - 1
	out, err := r.c.s3.GetObject(r.ctx, &s3.GetObjectInput{Bucket: aws.String(r.bucket), Key: aws.String(r.key),
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, end))})
	if err != nil {
		return fmt.Errorf("read %s bytes %d-%d: %s", ObjectURL(r.bucket, r.key), off, end, Describe(err))
	}
	defer out.Body.Close()
	b := make([]byte, end-off+1)
	if _, err := io.ReadFull(out.Body, b); err != nil {
		return fmt.Errorf("read %s bytes %d-%d: %w", ObjectURL(r.bucket, r.key), off, end, err)
	}
	r.fetched += int64(len(b))
	r.gets++
	r.spans = append(r.spans, span{off: off, data: b})
	if len(r.spans) > cachedSpans {
		r.spans = r.spans[1:]
	}
	return nil
}
