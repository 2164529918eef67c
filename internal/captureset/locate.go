package captureset

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// Locate resolves a rank's stream location against the manifest's own location: an s3://
// URL or an absolute path is taken as it is; a relative path is relative to the
// manifest's directory — a local directory, or the manifest object's "directory" when the
// manifest itself was read from s3:// (it may not climb out of the bucket).
func Locate(manifest, stream string) (string, error) {
	if err := checkLocation(stream); err != nil {
		return "", err
	}
	if strings.HasPrefix(stream, "s3://") || filepath.IsAbs(stream) {
		return stream, nil
	}
	if rest, ok := strings.CutPrefix(manifest, "s3://"); ok {
		bucket, key, _ := strings.Cut(rest, "/")
		joined := path.Join(path.Dir(key), stream)
		if joined == ".." || strings.HasPrefix(joined, "../") {
			return "", fmt.Errorf("%q relative to s3://%s/%s leaves the bucket", stream, bucket, key)
		}
		return "s3://" + bucket + "/" + strings.TrimPrefix(joined, "./"), nil
	}
	return filepath.Join(filepath.Dir(manifest), stream), nil
}
