// Package stream owns the v2 capture stream file format (docs/STREAM_FORMAT.md): the packet
// header and its checks, the TOKEN/DROP meta schema, the Writer the daemon streams packets
// through, the Reader, index, Verify and Inspect walks behind `strapd verify|inspect`, and
// the resume-prefix check that both a resumed session and checkpoint repair rely on.
package stream
