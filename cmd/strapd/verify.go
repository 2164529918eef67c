package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/strap-llm/strap/internal/captureset"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
)

// damagedError makes `strapd verify` exit 2 for a damaged or truncated stream.
type damagedError struct{ msg string }

func (e damagedError) Error() string { return e.msg }

// ExitCode is 2: the file was read, and it is not whole.
func (damagedError) ExitCode() int { return 2 }

// newVerifyCmd builds `strapd verify FILE [--json]`: every packet's CRC, sequence numbers,
// END, INDEX and footer (stream.Verify). Of a capture-set manifest (docs/DISTRIBUTED.md
// D4): the manifest's own checks, then every rank's stream verified and checked against
// it. Exit 0 when whole, 2 when damaged or truncated (or an invalid manifest, or a set
// whose streams disagree with it), 1 when the file cannot be read at all.
func newVerifyCmd() *cobra.Command {
	var asJSON bool
	var s3o upload.ClientOptions
	cmd := &cobra.Command{
		Use:   "verify FILE|MANIFEST|s3://bucket/key",
		Short: "Check a capture stream (every CRC, sequence numbers, END/INDEX/footer), or every rank's stream of a capture-set manifest against it; exit 2 if damaged",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, isSet, err := readManifest(cmd.Context(), args[0], s3o)
			if _, invalid := errors.AsType[*captureset.InvalidError](err); invalid {
				return damagedError{err.Error()}
			}
			if err != nil {
				return err
			}
			if isSet {
				return verifySet(cmd.Context(), cmd.OutOrStdout(), args[0], m, s3o, asJSON)
			}
			// Verify reads every byte: an object is read in ranges of at least 8 MiB.
			r, size, done, err := openStreamSource(cmd.Context(), args[0], s3o, 8<<20)
			if err != nil {
				return err
			}
			defer done()
			rep := stream.Verify(r, size)
			if err := readFailed(r); err != nil {
				return err // exit 1: the object could not be read, which says nothing of it
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else if err := rep.WriteText(out); err != nil {
				return err
			}
			if rep.OK {
				return nil
			}
			if f, ok := r.(*os.File); ok {
				// A stream freed behind its upload reads zeros there: say so, not only "damaged".
				if s, e, freed, _ := stream.FreedRange(f, 0, size); freed {
					return damagedError{fmt.Sprintf("%s: bytes [%d, %d) were freed on the local disk after their upload (strapd serve --upload-free-local); verify the object instead", args[0], s, e)}
				}
			}
			switch {
			case rep.Truncated:
				return damagedError{fmt.Sprintf("%s: truncated at offset %d", args[0], rep.FirstBadOffset)}
			case rep.FirstBadOffset >= 0:
				return damagedError{fmt.Sprintf("%s: damaged at offset %d", args[0], rep.FirstBadOffset)}
			}
			return damagedError{fmt.Sprintf("%s: not whole: %s", args[0], rep.Problems[0])}
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	addS3ReadFlags(cmd.Flags(), &s3o)
	return cmd
}
