package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/strap-llm/strap/internal/checkpoint"
)

// notResumableError makes `strapd resume` exit 2 when the stream does not match its
// checkpoint (1 stays for files that cannot be read at all).
type notResumableError struct{ msg string }

func (e notResumableError) Error() string { return e.msg }

// ExitCode is 2: the files were read, and they do not agree.
func (notResumableError) ExitCode() int { return 2 }

// resumeConfig are the flags of `strapd resume`.
type resumeConfig struct {
	// Checkpoint is the checkpoint file ("" = STREAM.ckpt.json).
	Checkpoint string
	// Repair cuts the stream back to its checkpoint.
	Repair bool
	// Force lets Repair cut a complete capture (its END "complete", INDEX and footer, and
	// what follows its last intact token): never done without it.
	Force bool
	// JSON prints reports as JSON.
	JSON bool
	// List is a directory whose checkpoints are listed instead of checking one stream.
	List string
}

func (c *resumeConfig) validate(args []string) error {
	switch {
	case c.List != "" && len(args) > 0:
		return errors.New("give either --list DIR or a STREAM, not both")
	case c.List != "" && (c.Repair || c.Checkpoint != "" || c.Force):
		return errors.New("--list takes no --repair, --force or --checkpoint")
	case c.Force && !c.Repair:
		return errors.New("--force goes with --repair (it lets --repair cut a complete capture)")
	case c.List == "" && len(args) != 1:
		return errors.New("name one STREAM (or --list DIR)")
	}
	return nil
}

// newResumeCmd builds `strapd resume STREAM [--checkpoint P] [--repair] [--json]` and
// `strapd resume --list DIR`: whether a capture can be resumed, from which token and
// offset, what a resume cuts; --repair makes the stream consistent with its checkpoint.
func newResumeCmd() *cobra.Command {
	var cfg resumeConfig
	cmd := &cobra.Command{
		Use:   "resume STREAM | --list DIR",
		Short: "Say whether and where a capture can resume (and --repair it), or list resumable captures",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.validate(args); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if cfg.List != "" {
				es, err := checkpoint.List(cfg.List)
				if err != nil {
					return err
				}
				if cfg.JSON {
					if es == nil {
						es = []checkpoint.Entry{}
					}
					return writeJSON(out, es)
				}
				return printList(out, es)
			}
			stream := args[0]
			var (
				rep checkpoint.Report
				err error
			)
			if cfg.Repair {
				rep, err = checkpoint.Repair(stream, cfg.Checkpoint, cfg.Force)
			} else {
				rep, _, err = checkpoint.CheckFile(stream, cfg.Checkpoint)
			}
			if rep.Resumable || len(rep.Problems) > 0 {
				if cfg.JSON {
					if jerr := writeJSON(out, rep); jerr != nil {
						return jerr
					}
				} else {
					printReport(out, rep, cfg.Repair && err == nil)
				}
			}
			switch {
			case rep.Complete && err == nil && cfg.Repair:
				// --force: cut as asked, and said so above.
			case rep.Complete:
				return notResumableError{fmt.Sprintf("%s is a complete capture: nothing to resume, nothing was cut", stream)}
			case errors.Is(err, checkpoint.ErrMismatch) || (err == nil && !rep.Resumable):
				return notResumableError{fmt.Sprintf("%s cannot resume (%s)", stream, from(rep))}
			case err != nil:
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Checkpoint, "checkpoint", "", "checkpoint file (default STREAM"+checkpoint.Suffix+")")
	f.BoolVar(&cfg.Repair, "repair", false, "cut the stream back to where a resume goes on (refused while a capture holds it, and for a complete capture)")
	f.BoolVar(&cfg.Force, "force", false, "with --repair: cut a complete capture too (drops its END and INDEX and every packet after its last intact token; the report says how many bytes)")
	f.BoolVar(&cfg.JSON, "json", false, "print the report as JSON")
	f.StringVar(&cfg.List, "list", "", "list the checkpoints in this directory and whether each can resume")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// from names what a report checked: the checkpoint file, or the stream alone.
func from(r checkpoint.Report) string {
	if r.Checkpoint == "" {
		return "no checkpoint: the stream alone"
	}
	return "checkpoint " + r.Checkpoint
}

func printReport(w io.Writer, r checkpoint.Report, repaired bool) {
	if r.Complete && !repaired {
		fmt.Fprintf(w, "%s: complete capture, nothing to resume (%s)\n", r.Stream, from(r))
		ends := "END (complete)"
		if r.CutIndex {
			ends += ", INDEX and footer"
		}
		fmt.Fprintf(w, "  the stream ends with %s; it is left as it is\n", ends)
		fmt.Fprintf(w, "  a resume would cut %d bytes back to token %d (offset %d): %d packets (%d tokens)\n",
			r.CutBytes, r.ResumeToken, r.ResumeOffset, r.CutPackets, r.CutTokens)
		return
	}
	if !r.Resumable && !r.Complete {
		fmt.Fprintf(w, "%s: NOT resumable (%s)\n", r.Stream, from(r))
		if r.FreedNote != "" {
			fmt.Fprintf(w, "  %s\n", r.FreedNote)
		}
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  - %s\n", p)
		}
		return
	}
	if r.Complete {
		fmt.Fprintf(w, "%s: complete capture, cut back by --force (%s)\n", r.Stream, from(r))
	} else {
		fmt.Fprintf(w, "%s: resumable (%s)\n", r.Stream, from(r))
	}
	if r.FreedNote != "" {
		fmt.Fprintf(w, "  %s\n", r.FreedNote)
	}
	fmt.Fprintf(w, "  resume from token %d at byte offset %d (%d packets, last seq %d)\n",
		r.ResumeToken, r.ResumeOffset, r.Packets, r.LastSeq)
	switch {
	case r.Source == checkpoint.SourceCheckpoint:
		fmt.Fprintf(w, "  using the checkpoint: no intact token follows it in the stream\n")
	case r.Checkpoint != "":
		fmt.Fprintf(w, "  using the stream's intact prefix: %d tokens past the checkpoint (token %d, offset %d), every packet CRC-checked\n",
			r.ResumeToken-r.TokenCount, r.TokenCount, r.CheckpointOffset)
	default:
		fmt.Fprintf(w, "  using the stream's intact prefix (no checkpoint), every packet CRC-checked\n")
	}
	verb := "would cut"
	if repaired {
		verb = "cut"
	}
	if r.CutBytes == 0 {
		fmt.Fprintf(w, "  nothing after the resume point: the stream ends there\n")
		return
	}
	fmt.Fprintf(w, "  %s %d bytes: %d packets (%d tokens to generate again)", verb, r.CutBytes, r.CutPackets, r.CutTokens)
	if r.CutEnd != "" {
		fmt.Fprintf(w, ", END (%s)", r.CutEnd)
	}
	if r.CutIndex {
		fmt.Fprintf(w, ", INDEX and footer")
	}
	if r.TornAt >= 0 {
		fmt.Fprintf(w, ", a torn packet at offset %d", r.TornAt)
	}
	fmt.Fprintln(w)
}

func printList(w io.Writer, es []checkpoint.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tRESUMABLE\tFROM TOKEN\tOFFSET\tCUT BYTES\tNOTE")
	for _, e := range es {
		note := e.Error
		if note == "" && len(e.Problems) > 0 {
			note = e.Problems[0]
		}
		yes := "no"
		if e.Resumable && e.Error == "" {
			yes = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", e.Stream, yes, e.ResumeToken, e.ResumeOffset, e.CutBytes, note)
	}
	return tw.Flush()
}
