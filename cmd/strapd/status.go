package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/units"
)

func newStatusCmd() *cobra.Command {
	var (
		socket  string
		asJSON  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the running daemon and its sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			path := control.ClientSocketPath(socket)
			c, err := control.Dial(ctx, path, "strapd-status/"+version)
			if err != nil {
				return fmt.Errorf("is strapd running? %w", err)
			}
			defer c.Disconnect()
			rep, err := c.Status()
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			return printStatus(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", "", "control socket path (default: resolved as in PROTOCOL.md 1)")
	f.BoolVar(&asJSON, "json", false, "print the STATUS_REPLY as JSON")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the daemon")
	return cmd
}

func printStatus(w io.Writer, rep control.StatusReply) error {
	d := rep.Daemon
	fmt.Fprintf(w, "strapd %s  pid %d  up %s  socket %s\n", d.Version, d.PID,
		(time.Duration(d.UptimeS * float64(time.Second))).Round(time.Second), d.Socket)
	fmt.Fprintf(w, "memory %s of %s  sessions %d\n", units.Bytes(float64(d.MemoryUsed)), units.Bytes(float64(d.MemoryLimit)), d.Sessions)
	if d.CPUBudget != nil {
		fmt.Fprintf(w, "cpu budget %g CPUs for compression  %d blocks stored raw over it\n", *d.CPUBudget, d.CPURawBlocks)
	}
	printProbes(w, d.Probes)
	if hidden := d.Sessions - len(rep.Sessions); hidden > 0 {
		// STATUS lists only the asking uid's sessions (root sees all): say so.
		fmt.Fprintf(w, "%d session(s) of other users not shown\n", hidden)
	}
	printUploads(w, d.Upload, rep.Uploads)
	if len(rep.Sessions) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nSESSION\tPID\tUID\tMODEL\tCODEC\tAGE\tIN\tOUT\tRATIO\tIN MB/s\tOUT MB/s\tRING\tDROPS\tTOKENS\tRESOURCES\tCHECKPOINT\tRANK\tOUTPUT")
	for _, s := range rep.Sessions {
		ck := "-"
		if s.LastCheckpointAgeS >= 0 {
			ck = fmt.Sprintf("%d, %s ago", s.Checkpoints, secs(s.LastCheckpointAgeS))
		}
		res := "-"
		if s.ResourceLog {
			res = fmt.Sprintf("%d", s.ResourceEvents)
			if s.ResourceEventsLost > 0 {
				res += fmt.Sprintf(" (%d lost: %s)", s.ResourceEventsLost, s.ResourceLogError)
			}
		}
		ratio := "-"
		if s.Ratio > 0 {
			ratio = fmt.Sprintf("%.2fx", s.Ratio)
		}
		// A rank of a distributed job: rank/world_size@host (DISTRIBUTED.md); "-" for one process.
		rank := "-"
		if d := s.Distributed; d != nil {
			rank = fmt.Sprintf("%d/%d@%s", d.Rank, d.WorldSize, d.Host)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%.0f%%\t%d\t%d\t%s\t%s\t%s\t%s\n", s.Session, s.PID, s.UID,
			s.ModelClass, s.Codec, secs(s.AgeS), units.Bytes(float64(s.BytesIn)), units.Bytes(float64(s.BytesOut)), ratio, s.InMBps, s.OutMBps,
			100*s.RingFill, s.Drops, s.Tokens, res, ck, rank, s.OutputPath)
	}
	return tw.Flush()
}

// secs prints a duration in seconds rounded for people.
func secs(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// printUploads shows the object-storage configuration and each upload (OBJECT_STORAGE.md).
func printUploads(w io.Writer, d *control.UploadDaemonStatus, ups []control.UploadStatus) {
	if d == nil {
		return
	}
	if d.Error != "" {
		fmt.Fprintf(w, "uploads unavailable: %s\n", d.Error)
		return
	}
	target := d.Target
	if target == "" {
		target = "(per session)"
	}
	sse := d.SSE
	if sse == "" {
		sse = "bucket default"
	}
	fmt.Fprintf(w, "upload %s  uploaded %s  errors %d  keep local %v  free local %v  encryption %s\n", target,
		units.Bytes(float64(d.UploadedBytes)), d.Errors, d.KeepLocal, d.FreeLocal, sse)
	if len(ups) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nOBJECT\tSESSION\tSTATE\tDURABLE\tUPLOADED\tLAG\tPARTS\tERRORS\tNOTE (freed locally; not freeing: why; last error)")
	for _, u := range ups {
		var notes []string
		if u.FreedBytes > 0 {
			notes = append(notes, "freed locally "+units.Bytes(float64(u.FreedBytes)))
		}
		if u.FreeError != "" {
			notes = append(notes, "not freeing: "+u.FreeError)
		}
		if u.LastError != "" {
			notes = append(notes, u.LastError)
		}
		last := strings.Join(notes, "; ")
		if last == "" {
			last = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", u.Object, u.Session, u.State, units.Bytes(float64(u.DurableBytes)),
			units.Bytes(float64(u.UploadedBytes)), units.Bytes(float64(u.LagBytes)), u.Parts, u.Errors, last)
	}
	_ = tw.Flush()
}
