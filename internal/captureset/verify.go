package captureset

import (
	"context"
	"fmt"
	"io"

	"github.com/strap-llm/strap/internal/stream"
)

// Opener opens a stream location (a path or an s3:// URL) for reading; readAhead is the
// smallest range an object read fetches. done releases it; readErr, called after the
// reads, is an object read that failed on the way (nil for files).
type Opener func(ctx context.Context, loc string, readAhead int64) (r io.ReaderAt, size int64, done func(), readErr func() error, err error)

// RankReport is what verifying one rank found.
type RankReport struct {
	Rank int `json:"rank"`
	// Stream is the stream's resolved location.
	Stream string `json:"stream"`
	OK     bool   `json:"ok"`
	// Verify is the stream's own check (every CRC, sequence numbers, END/INDEX/footer);
	// nil when the stream could not be opened.
	Verify *stream.Report `json:"verify,omitempty"`
	// Problems are this rank's: the stream missing or damaged, and each manifest key its
	// stream disagrees with.
	Problems []Problem `json:"problems,omitempty"`
}

// SetReport is what VerifySet found.
type SetReport struct {
	Manifest string `json:"manifest"`
	// OK: every stream verifies and agrees with the manifest.
	OK    bool         `json:"ok"`
	Ranks []RankReport `json:"ranks"`
}

// VerifySet verifies every rank's stream of m (read from location loc) with the stream
// verifier and checks the manifest against it (Compare). It never fails: what it finds is
// in the report.
func VerifySet(ctx context.Context, m *Manifest, loc string, open Opener) *SetReport {
	rep := &SetReport{Manifest: loc, OK: true}
	for i := range m.Ranks {
		rr := verifyRank(ctx, m, &m.Ranks[i], loc, open)
		rr.OK = len(rr.Problems) == 0
		rep.OK = rep.OK && rr.OK
		rep.Ranks = append(rep.Ranks, rr)
	}
	return rep
}

func verifyRank(ctx context.Context, m *Manifest, e *Rank, loc string, open Opener) RankReport {
	rr := RankReport{Rank: e.Rank}
	bad := func(key, format string, args ...any) {
		rr.Problems = append(rr.Problems, Problem{Rank: e.Rank, Key: key, Message: fmt.Sprintf(format, args...)})
	}
	path, err := Locate(loc, e.Stream)
	if err != nil {
		bad("stream", "%v", err)
		return rr
	}
	rr.Stream = path
	// Verify reads every byte: an object is read in ranges of at least 8 MiB.
	r, size, done, readErr, err := open(ctx, path, 8<<20)
	if err != nil {
		bad("stream", "%v", err)
		return rr
	}
	vr := stream.Verify(r, size)
	failed := readErr()
	done()
	if failed != nil {
		bad("stream", "%s: read failed: %v", path, failed)
		return rr
	}
	rr.Verify = &vr
	if !vr.OK {
		bad("stream", "%s does not verify: %s", path, vr.Problems[0])
	}
	// The facts walk reads packet headers only: an object by range, each header with
	// 16 KiB after it.
	r, size, done, readErr, err = open(ctx, path, 16<<10)
	if err != nil {
		bad("stream", "%v", err)
		return rr
	}
	f, ferr := ReadFacts(r, size)
	failed = readErr()
	done()
	switch {
	case failed != nil:
		bad("stream", "%s: read failed: %v", path, failed)
	case ferr != nil:
		bad("stream", "%s: %v", path, ferr)
	default:
		rr.Problems = append(rr.Problems, Compare(m, e, f)...)
	}
	return rr
}
