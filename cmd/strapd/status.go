package main

// PLACEHOLDER: replaced by the helper that owns this command.

import (
	"errors"

	"github.com/spf13/cobra"
)

func newStatusCmd() *cobra.Command {
	return &cobra.Command{Use: "status", RunE: func(*cobra.Command, []string) error { return errors.New("status: not built yet") }}
}
