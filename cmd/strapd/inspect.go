package main

import (
	"encoding/json"

	"github.com/spf13/cobra"

	"github.com/strap-llm/strap/internal/stream"
)

// newInspectCmd builds `strapd inspect FILE [--json]`: a per-module summary of a stream
// read from packet headers alone (stream.Inspect), with the lossy codecs' bound and
// achieved errors from each packet's "lossy" meta.
func newInspectCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Summarize a capture stream per module: packets, dtype, shape, raw and stored bytes, ratio, lossy error bound and achieved errors",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sum, err := stream.InspectFile(args[0])
			if err != nil {
				return err
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
	return cmd
}
