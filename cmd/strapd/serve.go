package main

// PLACEHOLDER: replaced by the helper that owns this command.

import (
	"errors"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
)

func newServeCmd(_ func() *zap.Logger) *cobra.Command {
	return &cobra.Command{Use: "serve", RunE: func(*cobra.Command, []string) error { return errors.New("serve: not built yet") }}
}
