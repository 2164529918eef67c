package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
)

// newInspectCmd builds `strapd inspect FILE [--json]`: a per-module summary of a stream
// read from packet headers alone (stream.Inspect), with the lossy codecs' bound and
// achieved errors from each packet's "lossy" meta; of a capture-set manifest
// (docs/DISTRIBUTED.md D4, told by its content), the checked manifest: the job, its
// layout and each rank's host, place, session, status, tokens and stream.
func newInspectCmd() *cobra.Command {
	var asJSON bool
	var s3o upload.ClientOptions
	cmd := &cobra.Command{
		Use:   "inspect FILE|MANIFEST|s3://bucket/key",
		Short: "Summarize a capture stream per module (packets, dtype, shape, raw and stored bytes, ratio, lossy errors), or a capture-set manifest per rank",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, isSet, err := readManifest(cmd.Context(), args[0], s3o)
			if err != nil {
				return err
			}
			if isSet {
				sum := summarizeSet(args[0], m)
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(sum)
				}
				return writeSetText(cmd.OutOrStdout(), sum)
			}
			// An object is read by range: each packet header with 16 KiB after it (the
			// small packets that follow), never a large payload.
			r, size, done, err := openStreamSource(cmd.Context(), args[0], s3o, 16<<10)
			if err != nil {
				return err
			}
			defer done()
			sum, err := stream.Inspect(r, size)
			if rerr := readFailed(r); rerr != nil {
				return rerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(sum)
			}
			return sum.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON")
	addS3ReadFlags(cmd.Flags(), &s3o)
	return cmd
}
