// Command strapd is the STRAP-LLM sidecar daemon: it receives activation tensors from
// capture clients over memfd rings, compresses them on all cores and streams them to disk,
// and records what the kernel does around the model with eBPF probes.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
)

// version is the strapd release; overridden at link time with -ldflags "-X main.version=…".
var version = "0.1.0"

func main() { os.Exit(run()) }

// run builds the command tree and executes it; every subcommand returns its error here so
// the exit status is decided in one place.
func run() int {
	var logLevel string
	root := &cobra.Command{
		Use:           "strapd",
		Short:         "STRAP-LLM capture daemon: activations over shared memory to disk, plus eBPF probes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	logger := func() *zap.Logger { return newLogger(logLevel) }

	root.AddCommand(
		newServeCmd(logger),
		newStatusCmd(),
		newInspectCmd(),
		newVerifyCmd(),
		newTraceCmd(logger),
		newTopCmd(logger),
		newResumeCmd(),
		newUploadCmd(logger),
		newSalvageCmd(),
		newVersionCmd(),
	)
	if err := root.Execute(); err != nil {
		if ec, ok := errors.AsType[exitCoder](err); ok {
			if msg := err.Error(); msg != "" {
				fmt.Fprintln(os.Stderr, "strapd:", msg)
			}
			return ec.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "strapd:", err)
		return 1
	}
	return 0
}

// exitCoder is an error that asks for a specific exit status (e.g. verify: 2 for damage).
type exitCoder interface {
	error
	ExitCode() int
}

// newLogger logs human-readable lines on a terminal and JSON lines otherwise (journald,
// files, pipes), both to stderr.
func newLogger(level string) *zap.Logger {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		lvl = zapcore.InfoLevel
	}
	var cfg zap.Config
	if term.IsTerminal(int(os.Stderr.Fd())) {
		cfg = zap.NewDevelopmentConfig()
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		cfg.DisableStacktrace = true
	} else {
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.TimeKey = "ts"
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	l, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return l
}
