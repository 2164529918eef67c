// Package upload copies finished and durable bytes of capture streams into S3-compatible
// object storage: one multipart upload per stream, parts in file order, resumable from a
// small state file after a crash of strapd or of the server; and reads objects back by
// range for `strapd inspect|verify s3://...`. It knows nothing of the wire or the pipeline.
package upload
