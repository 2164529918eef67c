package upload

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// Target is where objects go: a bucket and a key prefix (no leading or trailing slash;
// empty for the bucket's root).
type Target struct {
	Bucket string
	Prefix string
}

// ErrBadURL is returned for anything that is not s3://bucket[/prefix].
var ErrBadURL = errors.New("not an s3:// URL")

// ParseURL reads "s3://bucket/prefix" (the prefix may be empty or end in "/").
func ParseURL(s string) (Target, error) {
	rest, ok := strings.CutPrefix(s, "s3://")
	if !ok {
		return Target{}, fmt.Errorf("%q: %w (expected s3://bucket/prefix)", s, ErrBadURL)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	if err := checkBucket(bucket); err != nil {
		return Target{}, fmt.Errorf("%q: %w", s, err)
	}
	prefix = strings.Trim(prefix, "/")
	for _, seg := range strings.Split(prefix, "/") {
		if prefix != "" && (seg == "" || seg == "." || seg == "..") {
			return Target{}, fmt.Errorf("%q: %w: empty, . or .. segment in the key prefix", s, ErrBadURL)
		}
	}
	if len(prefix) > 512 {
		return Target{}, fmt.Errorf("%q: %w: key prefix longer than 512 bytes", s, ErrBadURL)
	}
	return Target{Bucket: bucket, Prefix: prefix}, nil
}

// checkBucket applies S3's bucket naming rules that matter for URLs and path-style
// addressing: 3 to 63 characters of lowercase letters, digits, '-' and '.'.
func checkBucket(b string) error {
	if len(b) < 3 || len(b) > 63 {
		return fmt.Errorf("%w: bucket name %q must be 3 to 63 characters", ErrBadURL, b)
	}
	for _, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return fmt.Errorf("%w: bucket name %q may hold only a-z, 0-9, '-' and '.'", ErrBadURL, b)
		}
	}
	return nil
}

// Key is the object key of a file named name (a base name) under the target.
func (t Target) Key(name string) string {
	name = path.Base(name)
	if t.Prefix == "" {
		return name
	}
	return t.Prefix + "/" + name
}

// Sub is the target one key segment below t (seg: no slash, not empty).
func (t Target) Sub(seg string) Target {
	if t.Prefix == "" {
		return Target{Bucket: t.Bucket, Prefix: seg}
	}
	return Target{Bucket: t.Bucket, Prefix: t.Prefix + "/" + seg}
}

// Contains reports whether target o lies under t: the same bucket, and a prefix at or below t's.
func (t Target) Contains(o Target) bool {
	if t.Bucket != o.Bucket {
		return false
	}
	return t.Prefix == "" || o.Prefix == t.Prefix || strings.HasPrefix(o.Prefix, t.Prefix+"/")
}

// String is the target as an s3:// URL.
func (t Target) String() string {
	if t.Prefix == "" {
		return "s3://" + t.Bucket
	}
	return "s3://" + t.Bucket + "/" + t.Prefix
}

// ObjectURL is s3://bucket/key.
func ObjectURL(bucket, key string) string { return "s3://" + bucket + "/" + key }
