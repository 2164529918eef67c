// Package writer owns the v2 capture stream file (docs/STREAM_FORMAT.md): the Writer the
// daemon streams packets through, the Reader that parses and decodes them, and the Verify
// and Inspect walks behind `strapd verify` and `strapd inspect`.
package writer
