package main

// PLACEHOLDER: replaced by the helper that owns this command.

import (
	"errors"

	"github.com/spf13/cobra"
)

func newInspectCmd() *cobra.Command {
	return &cobra.Command{Use: "inspect", RunE: func(*cobra.Command, []string) error { return errors.New("inspect: not built yet") }}
}
