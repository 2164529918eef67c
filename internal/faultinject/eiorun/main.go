//go:build linux

// Command eiorun runs a command whose writes to the files of one directory fail with EIO
// (internal/faultinject), for the tests of what strapd does on an I/O error:
//
//	eiorun -dir DIR [-after BYTES] [-armed FILE] -- strapd serve ...
//
// A write to a file directly in DIR that already holds BYTES or more fails while FILE
// exists; removing FILE lifts the fault. Signals are passed on to the command, and eiorun
// exits with its status. Each injected EIO is logged to stderr.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/strap-llm/strap/internal/faultinject"
)

func main() { os.Exit(run()) }

func run() int {
	faultinject.ChildMain()
	var rule faultinject.Rule
	flag.StringVar(&rule.Dir, "dir", "", "fail writes to files directly in this directory")
	flag.Int64Var(&rule.After, "after", 0, "once the file holds at least this many bytes")
	flag.StringVar(&rule.Armed, "armed", "", "only while this file exists (empty: always)")
	flag.Parse()
	if rule.Dir == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: eiorun -dir DIR [-after BYTES] [-armed FILE] -- command [args...]")
		return 2
	}
	rule.Log = func(path string, size int64) {
		fmt.Fprintf(os.Stderr, "eiorun: EIO for a write to %s (%d bytes)\n", path, size)
	}
	p, err := faultinject.Start(rule, flag.Args(), os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "eiorun: %v\n", err)
		return 1
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	go func() {
		for s := range sigs {
			_ = p.Signal(s)
		}
	}()
	err = p.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "eiorun: %v\n", err)
		return 1
	}
	return 0
}
