package main

// PLACEHOLDER: replaced by the helper that owns this command.

import (
	"errors"

	"github.com/spf13/cobra"
)

func newVerifyCmd() *cobra.Command {
	return &cobra.Command{Use: "verify", RunE: func(*cobra.Command, []string) error { return errors.New("verify: not built yet") }}
}
