package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the strapd version and the protocol/stream versions it speaks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "strapd %s (protocol 1, stream format 2, %s %s/%s)\n",
				version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
