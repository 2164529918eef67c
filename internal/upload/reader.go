package upload

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// ObjectReader reads an object by byte ranges (io.ReaderAt), a block at a time: `strapd
// inspect` reads packet headers scattered through the object, `verify` reads it in order,
// and neither fetches more than the blocks it touches.
type ObjectReader struct {
	c           *Client
	ctx         context.Context
	bucket, key string
	size        int64
	block       int64

	mu      sync.Mutex
	cache   map[int64][]byte // block number → bytes
	order   []int64          // least recently fetched first
	fetched int64            // bytes fetched from the server
	gets    int
}

// cachedBlocks bounds the reader's memory: cachedBlocks × block bytes.
const cachedBlocks = 4

// OpenObject finds the object's size (one HEAD) and returns a reader of blocks of block bytes.
func OpenObject(ctx context.Context, c *Client, url string, block int64) (*ObjectReader, error) {
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
	if block <= 0 {
		block = 1 << 20
	}
	return &ObjectReader{c: c, ctx: ctx, bucket: t.Bucket, key: t.Prefix, size: aws.ToInt64(out.ContentLength),
		block: block, cache: map[int64][]byte{}}, nil
}

// Size is the object's size.
func (r *ObjectReader) Size() int64 { return r.size }

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
	n := 0
	for n < len(p) {
		if off >= r.size {
			return n, io.EOF
		}
		bn := off / r.block
		b, err := r.blockAt(bn)
		if err != nil {
			return n, err
		}
		k := copy(p[n:], b[off-bn*r.block:])
		n += k
		off += int64(k)
	}
	return n, nil
}

func (r *ObjectReader) blockAt(bn int64) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b, ok := r.cache[bn]; ok {
		return b, nil
	}
	start := bn * r.block
	end := min(start+r.block, r.size) - 1
	out, err := r.c.s3.GetObject(r.ctx, &s3.GetObjectInput{Bucket: aws.String(r.bucket), Key: aws.String(r.key),
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", start, end))})
	if err != nil {
		return nil, fmt.Errorf("read %s bytes %d-%d: %s", ObjectURL(r.bucket, r.key), start, end, Describe(err))
	}
	defer out.Body.Close()
	b := make([]byte, end-start+1)
	if _, err := io.ReadFull(out.Body, b); err != nil {
		return nil, fmt.Errorf("read %s bytes %d-%d: %w", ObjectURL(r.bucket, r.key), start, end, err)
	}
	r.fetched += int64(len(b))
	r.gets++
	r.cache[bn] = b
	r.order = append(r.order, bn)
	if len(r.order) > cachedBlocks {
		delete(r.cache, r.order[0])
		r.order = r.order[1:]
	}
	return b, nil
}
