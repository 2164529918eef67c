package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/strap-llm/strap/internal/checkpoint"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
)

// salvageReport is `strapd salvage`'s answer: what was completed and what of it reads.
type salvageReport struct {
	upload.Salvaged
	// Readable is the completed object read back as a stream (every packet's CRC).
	Readable *stream.Report `json:"readable"`
	// UnreadableBytes are the object's bytes after its last whole packet: a packet cut at
	// the part boundary (Readable.Truncated), or damage (Readable.FirstBadOffset).
	UnreadableBytes int64 `json:"unreadable_bytes"`
	// Resume is `strapd resume`'s check of the object as a stream without checkpoint (the
	// checkpoint stayed on the dead host): whether and from which token it resumes.
	Resume *checkpoint.Report `json:"resume"`
}

// newSalvageCmd builds `strapd salvage s3://bucket/key --host-is-gone` and
// `strapd salvage --list s3://bucket/prefix` (docs/OBJECT_STORAGE.md, "A host that died
// mid-capture").
func newSalvageCmd() *cobra.Command {
	var o upload.ClientOptions
	var so upload.SalvageOptions
	var list, asJSON bool
	cmd := &cobra.Command{
		Use:   "salvage s3://bucket/key --host-is-gone | salvage --list s3://bucket/prefix",
		Short: "Complete the open multipart upload a dead host's strapd left of a capture into a readable object (its parts from part 1 on, up to the first gap), or list the open uploads under a prefix",
		Long: `salvage completes the open multipart upload of s3://bucket/key from its contiguous parts from
part 1: a prefix of the stream as it was on the dead host, cut at a part boundary. It refuses
when the key holds an object (never replaced), when there is no open upload, when there are
several (choose one with --upload-id; --list shows them) and without --host-is-gone (completing
ends the upload a strapd still running would be sending to). The object is then read back as a
stream and what it holds is reported: packets up to the last whole one, every CRC checked.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := upload.ParseURL(args[0])
			if err != nil {
				return err
			}
			c, err := upload.NewClient(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if list {
				ups, err := c.ListOpenUploads(cmd.Context(), t.Bucket, t.Prefix, false)
				if err != nil {
					return err
				}
				return writeOpenUploads(out, t, ups, asJSON)
			}
			if t.Prefix == "" {
				return fmt.Errorf("%s names a bucket, not an object (--list lists the open uploads under a prefix)", args[0])
			}
			res, err := c.Salvage(cmd.Context(), t.Bucket, t.Prefix, so)
			if err != nil {
				return err
			}
			rep := salvageReport{Salvaged: res}
			// Read the object back as a stream, in order: what was salvaged, every CRC checked.
			r, size, done, err := openStreamSource(cmd.Context(), res.Object, o, 8<<20)
			if err != nil {
				return fmt.Errorf("the upload was completed into %s, but reading it back failed: %w", res.Object, err)
			}
			defer done()
			v := stream.Verify(r, size)
			if err := readFailed(r); err != nil {
				return fmt.Errorf("the upload was completed into %s, but reading it back failed: %w", res.Object, err)
			}
			rep.Readable, rep.UnreadableBytes = &v, size-v.ValidUntil
			// What a resume of it would keep (CHECKPOINTS.md 4: without a checkpoint the
			// stream's intact prefix decides), read the same way.
			rc := checkpoint.Check(r, size, nil)
			if err := readFailed(r); err != nil {
				return fmt.Errorf("the upload was completed into %s, but reading it back failed: %w", res.Object, err)
			}
			rc.Stream = res.Object
			rep.Resume = &rc
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				err = enc.Encode(rep)
			} else {
				err = writeSalvage(out, rep)
			}
			if err == nil && v.ValidUntil == 0 {
				// Completed (that cannot be undone), but nothing in it reads as a stream.
				return damagedError{fmt.Sprintf("%s: completed, but not readable as a capture stream: %s", res.Object, v.Error)}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&so.HostIsGone, "host-is-gone", false, "confirm the host (and strapd) that sent the upload is gone: completing ends the multipart upload, and a strapd still sending to it would find it gone")
	f.StringVar(&so.UploadID, "upload-id", "", "the open upload to complete when the key has several (--list shows them)")
	f.BoolVar(&list, "list", false, "list the open multipart uploads under the s3://bucket/prefix (initiation time, parts, bytes, what salvage would complete); changes nothing")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.StringVar(&o.Endpoint, "s3-endpoint", "", "S3 API endpoint of a store other than AWS (path-style addressing)")
	f.StringVar(&o.Region, "s3-region", "", "region to sign requests for")
	f.StringVar(&o.Profile, "s3-profile", "", "shared config/credentials profile")
	return cmd
}

func writeSalvage(w io.Writer, r salvageReport) error {
	v := r.Readable
	fmt.Fprintf(w, "%s: completed upload %s from parts 1..%d: %d bytes (verified: %s)\n", r.Object, r.UploadID, r.Parts, r.Bytes, r.Verified)
	if r.LeftParts > 0 {
		fmt.Fprintf(w, "  left out: %d part(s) (%d bytes) after the first gap in the part numbers or a short part; they went with the upload\n", r.LeftParts, r.LeftBytes)
	}
	fmt.Fprintf(w, "  readable: %d packets (%d tensors, %d drops, %d tokens) in bytes [0, %d), every CRC checked\n",
		v.Packets, v.Tensors, v.Drops, v.Tokens, v.ValidUntil)
	switch {
	case v.Truncated:
		fmt.Fprintf(w, "  not readable: the last %d bytes, a packet cut at the part boundary\n", r.UnreadableBytes)
	case v.FirstBadOffset >= 0:
		fmt.Fprintf(w, "  not readable: the last %d bytes, damaged at offset %d: %s\n", r.UnreadableBytes, v.FirstBadOffset, v.Error)
	}
	if !v.HasFooter && v.ValidUntil > 0 {
		fmt.Fprintln(w, "  no INDEX or footer: readers scan it from the start (open_stream, strapd inspect); strapd verify reports it truncated (exit 2)")
	}
	if v.OK && v.End != nil && v.End.Status == "complete" {
		fmt.Fprintln(w, "  whole: the stream ended complete (END, INDEX and footer) before its upload was completed; nothing to resume")
		return nil
	}
	if rc := r.Resume; rc.Resumable {
		fmt.Fprintf(w, "  resumable from the stream alone (no checkpoint needed): download it and resume with resume_from_checkpoint=True; the resume keeps %d tokens (bytes [0, %d)) and cuts %d bytes\n",
			rc.ResumeToken, rc.ResumeOffset, rc.CutBytes)
	} else {
		fmt.Fprintf(w, "  not resumable: %s\n", strings.Join(rc.Problems, "; "))
	}
	return nil
}

func writeOpenUploads(w io.Writer, t upload.Target, ups []upload.OpenUpload, asJSON bool) error {
	if asJSON {
		if ups == nil {
			ups = []upload.OpenUpload{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(ups)
	}
	if len(ups) == 0 {
		fmt.Fprintf(w, "no open multipart uploads under %s\n", t)
		return nil
	}
	for _, u := range ups {
		fmt.Fprintf(w, "%s  upload %s  initiated %s  %d parts, %d bytes; salvageable: parts 1..%d, %d bytes",
			upload.ObjectURL(t.Bucket, u.Key), u.UploadID, u.Initiated.UTC().Format(time.RFC3339), u.Parts, u.Bytes, u.RunParts, u.RunBytes)
		if u.Missing > 0 {
			fmt.Fprintf(w, " (part %d missing)", u.Missing)
		}
		fmt.Fprintln(w)
	}
	return nil
}
