package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/strap-llm/strap/internal/captureset"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/units"
	"github.com/strap-llm/strap/internal/upload"
)

// readManifest reads arg (a path or s3:// URL) as a capture-set manifest when it is one:
// not a stream (no STRAPSTM magic) and a JSON object whose "format" is the manifest's —
// told by content, never by the file's name. isSet is false for anything else, which the
// caller then reads as a stream (and reports as such). An invalid manifest is an error
// listing what is wrong with it.
func readManifest(ctx context.Context, arg string, s3o upload.ClientOptions) (m *captureset.Manifest, isSet bool, err error) {
	r, size, done, err := openStreamSource(ctx, arg, s3o, 16<<10)
	if err != nil {
		return nil, false, nil // the stream path opens it again and says why it cannot
	}
	defer done()
	var head [16]byte
	n, _ := r.ReadAt(head[:min(int64(len(head)), size)], 0)
	if rerr := readFailed(r); rerr != nil {
		return nil, false, rerr
	}
	if bytes.HasPrefix(head[:n], []byte(stream.FileMagic)) || !bytes.HasPrefix(bytes.TrimLeft(head[:n], " \t\r\n"), []byte("{")) {
		return nil, false, nil
	}
	if size > captureset.MaxSize {
		return nil, true, fmt.Errorf("%s: a JSON document of %d bytes: %w", arg, size, captureset.ErrTooLarge)
	}
	b := make([]byte, size)
	if _, err := r.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, true, fmt.Errorf("read %s: %w", arg, err)
	}
	if rerr := readFailed(r); rerr != nil {
		return nil, true, rerr
	}
	if !captureset.Sniff(b) {
		return nil, false, nil
	}
	m, err = captureset.Parse(b)
	if err != nil {
		return nil, true, fmt.Errorf("%s: %w", arg, err)
	}
	return m, true, nil
}

// setOpener opens each rank's stream as inspect and verify open one (paths, s3:// URLs).
func setOpener(s3o upload.ClientOptions) captureset.Opener {
	return func(ctx context.Context, loc string, readAhead int64) (io.ReaderAt, int64, func(), func() error, error) {
		r, size, done, err := openStreamSource(ctx, loc, s3o, readAhead)
		if err != nil {
			return nil, 0, nil, nil, err
		}
		return r, size, done, func() error { return readFailed(r) }, nil
	}
}

// setSummary is `strapd inspect --json` of a manifest: the manifest as read and checked,
// with each rank's stream resolved against the manifest's location.
type setSummary struct {
	Manifest   string               `json:"manifest"`
	CaptureSet *captureset.Manifest `json:"capture_set"`
	// Streams are the ranks' streams resolved, in rank order.
	Streams []string `json:"streams"`
}

func summarizeSet(loc string, m *captureset.Manifest) setSummary {
	s := setSummary{Manifest: loc, CaptureSet: m}
	for _, r := range m.Ranks {
		p, err := captureset.Locate(loc, r.Stream)
		if err != nil {
			p = "(" + err.Error() + ")"
		}
		s.Streams = append(s.Streams, p)
	}
	return s
}

// writeSetText prints a manifest for people: the job, then one line per rank.
func writeSetText(w io.Writer, s setSummary) error {
	m := s.CaptureSet
	l := m.Layout
	fmt.Fprintf(w, "capture set %s\n", s.Manifest)
	fmt.Fprintf(w, "job %s  world size %d  layout tp %d × pp %d × dp %d  created %s\n\n", m.JobID, m.WorldSize,
		l.TPSize, l.PPSize, l.DPSize, m.Created)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tHOST\tLOCAL\tTP\tPP\tDP\tROLE\tSESSION\tSTRAPD\tSTATUS\tTOKENS\tFORWARDS\tPACKETS\tBYTES\tMODULES\tSTREAM")
	var packets, size uint64
	status := map[string]int{}
	for i, r := range m.Ranks {
		local := "-"
		if r.LocalRank != nil {
			local = fmt.Sprint(*r.LocalRank)
		}
		role := r.Role
		if role == "" {
			role = "-" // a manifest written before the key
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t[%d, %d)\t%d\t%d\t%s\t%s\t%s\n", r.Rank, r.Host, local,
			r.TPRank, r.PPStage, r.DPRank, role, r.Session, r.StrapdHost, r.Status, r.Tokens[0], r.Tokens[1], r.Forwards,
			r.Packets, units.Bytes(float64(r.Bytes)), moduleKinds(r.Modules), s.Streams[i])
		packets += r.Packets
		size += r.Bytes
		status[r.Status]++
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var st []string
	for _, k := range []string{"complete", "aborted", "error", captureset.StatusOpen} {
		if status[k] > 0 {
			st = append(st, fmt.Sprintf("%d %s", status[k], k))
		}
	}
	_, err := fmt.Fprintf(w, "\ntotal %d packets, %s; ranks %s\n", packets, units.Bytes(float64(size)), strings.Join(st, ", "))
	return err
}

// moduleKinds counts a rank's modules by kind: "3 local", "2 sharded, 1 replicated".
func moduleKinds(mods map[string]captureset.Module) string {
	n := map[string]int{}
	for _, m := range mods {
		n[m.Kind]++
	}
	var parts []string
	for _, k := range []string{captureset.KindSharded, captureset.KindReplicated, captureset.KindLocal} {
		if n[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// verifySet is `strapd verify` of a manifest: every rank's stream verified and checked
// against the manifest; exit 2 when anything is wrong.
func verifySet(ctx context.Context, out io.Writer, loc string, m *captureset.Manifest, s3o upload.ClientOptions, asJSON bool) error {
	rep := captureset.VerifySet(ctx, m, loc, setOpener(s3o))
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := writeSetReport(out, rep); err != nil {
		return err
	}
	if rep.OK {
		return nil
	}
	n := 0
	for _, r := range rep.Ranks {
		n += len(r.Problems)
	}
	return damagedError{fmt.Sprintf("%s: capture set not whole: %d problem(s)", loc, n)}
}

func writeSetReport(w io.Writer, rep *captureset.SetReport) error {
	state := "OK"
	if !rep.OK {
		state = "DAMAGED"
	}
	fmt.Fprintf(w, "capture set %s: %s (%d ranks)\n", rep.Manifest, state, len(rep.Ranks))
	for _, r := range rep.Ranks {
		if r.OK {
			fmt.Fprintf(w, "rank %d: OK  %s\n", r.Rank, r.Stream)
			continue
		}
		fmt.Fprintf(w, "rank %d: %d problem(s)  %s\n", r.Rank, len(r.Problems), r.Stream)
		for _, p := range r.Problems {
			fmt.Fprintf(w, "problem: %s\n", p)
		}
	}
	_, err := fmt.Fprint(w)
	return err
}
