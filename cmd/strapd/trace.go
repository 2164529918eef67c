package main

// PLACEHOLDER: replaced by the helper that owns this command.

import (
	"errors"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
)

func newTraceCmd(_ func() *zap.Logger) *cobra.Command {
	return &cobra.Command{Use: "trace", RunE: func(*cobra.Command, []string) error { return errors.New("trace: not built yet") }}
}
