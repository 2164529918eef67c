package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/checkpoint"
	"github.com/strap-llm/strap/internal/server"
	"github.com/strap-llm/strap/internal/upload"
)

// uploadConfig is serve's object-storage part (docs/OBJECT_STORAGE.md, docs/DEPLOY.md).
type uploadConfig struct {
	// Target is --upload: where every session's stream goes unless OPEN names another.
	Target string
	// Allow are more targets a client of another user may name in OPEN.
	Allow []string
	// Client says how to reach the store (endpoint, region, profile).
	Client upload.ClientOptions
	// PartSize is the first parts' size (parts double every 1000).
	PartSize byteSize
	// Concurrency is the parts of one upload in flight at once.
	Concurrency int
	// KeepLocal keeps the local files once their objects are complete and verified.
	KeepLocal bool
	// FreeLocal frees uploaded bytes of a stream on the local disk while it is captured.
	FreeLocal bool
	// StateDir holds the state of uploads not yet complete (empty: the default).
	StateDir string
}

func addUploadFlags(f *pflag.FlagSet, c *uploadConfig) {
	c.PartSize = 16 << 20
	f.StringVar(&c.Target, "upload", "", "upload every session's stream, trace and resource log to this s3://bucket/prefix while capturing (docs/OBJECT_STORAGE.md)")
	f.StringSliceVar(&c.Allow, "upload-allow", nil, "s3:// targets clients of other users may name per session (repeatable; --upload is one; strapd's own user may name any)")
	f.StringVar(&c.Client.Endpoint, "s3-endpoint", "", "S3 API endpoint of a store other than AWS, e.g. http://ceph-rgw:7480 (path-style addressing); default: AWS, or AWS_ENDPOINT_URL_S3")
	f.StringVar(&c.Client.Region, "s3-region", "", "region to sign requests for (default: AWS_REGION or the profile's, else us-east-1)")
	f.StringVar(&c.Client.Profile, "s3-profile", "", "shared config/credentials profile (default: AWS_PROFILE or default)")
	addSSEFlags(f, &c.Client)
	addDeadlineFlags(f, &c.Client)
	f.Var(&c.PartSize, "upload-part-size", "size of the first multipart parts (at least 5MiB; doubles every 1000 parts); the stream is made durable this often")
	f.IntVar(&c.Concurrency, "upload-concurrency", 4, "parts of one upload sent at once")
	f.BoolVar(&c.KeepLocal, "upload-keep-local", true, "keep the local files once their objects are complete and verified (false: delete them)")
	f.BoolVar(&c.FreeLocal, "upload-free-local", false, "free each stream's uploaded bytes on the local disk while it is captured (holes punched behind the upload and the last-but-one checkpoint; implies --upload-keep-local=false; docs/DEPLOY.md 8 gives the bound)")
	f.StringVar(&c.StateDir, "upload-state-dir", "", "directory of the upload state files (default: $STATE_DIRECTORY/uploads under systemd, else $XDG_STATE_HOME/strapd/uploads, else /var/lib/strapd/uploads as root, ~/.local/state/strapd/uploads otherwise)")
}

// addDeadlineFlags adds the deadline of every S3 call: a server that hangs is then a failed,
// retried attempt (and status shows the upload stalled after --upload-timeout).
func addDeadlineFlags(f *pflag.FlagSet, o *upload.ClientOptions) {
	f.DurationVar(&o.Timeout, "upload-timeout", upload.DefaultTimeout, "deadline of an S3 call moving no bytes, added to every call's (an upload with no answer from the server for this long shows as stalled)")
	var rate byteSize = upload.DefaultMinRate
	o.MinRate = int64(rate)
	f.Var(&minRate{&o.MinRate}, "upload-min-rate", "slowest transfer taken for a live one, per second: a part of N bytes must be sent within --upload-timeout + N / this")
}

// minRate binds --upload-min-rate (a byte size per second) to an int64.
type minRate struct{ v *int64 }

func (r *minRate) String() string {
	if r.v == nil {
		return ""
	}
	b := byteSize(*r.v)
	return b.String()
}

func (r *minRate) Set(s string) error {
	var b byteSize
	if err := b.Set(s); err != nil {
		return err
	}
	*r.v = int64(b)
	return nil
}

func (r *minRate) Type() string { return "bytes" }

// addSSEFlags adds the server-side encryption options of the objects strapd writes.
func addSSEFlags(f *pflag.FlagSet, o *upload.ClientOptions) {
	f.StringVar(&o.SSE, "s3-sse", "", "server-side encryption of every object strapd writes: AES256 (SSE-S3) or aws:kms (SSE-KMS); the server must confirm it (default: the bucket's own; SSE-C is not supported)")
	f.StringVar(&o.SSEKMSKeyID, "s3-sse-kms-key-id", "", "the KMS key (id, ARN or alias) for --s3-sse aws:kms (default: the account's AWS managed key)")
}

func (c *uploadConfig) validate() error {
	if err := c.Client.CheckSSE(); err != nil {
		return fmt.Errorf("--s3-sse: %w", err)
	}
	if c.Target != "" {
		if _, err := upload.ParseURL(c.Target); err != nil {
			return fmt.Errorf("--upload: %w", err)
		}
	}
	for _, a := range c.Allow {
		if _, err := upload.ParseURL(a); err != nil {
			return fmt.Errorf("--upload-allow: %w", err)
		}
	}
	if c.PartSize < upload.MinPartSize || c.PartSize > upload.MaxPartSize {
		return fmt.Errorf("--upload-part-size %d: must be 5MiB..5GiB (S3's part limits)", c.PartSize)
	}
	if c.Concurrency < 1 || c.Concurrency > 64 {
		return fmt.Errorf("--upload-concurrency %d: must be 1..64", c.Concurrency)
	}
	if c.Client.Timeout < 0 || c.Client.MinRate < 0 {
		return fmt.Errorf("--upload-timeout %s and --upload-min-rate %d: must not be negative (0: the default)", c.Client.Timeout, c.Client.MinRate)
	}
	return nil
}

// stateDir resolves --upload-state-dir.
func (c *uploadConfig) stateDir() string {
	if c.StateDir != "" {
		return c.StateDir
	}
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		return filepath.Join(strings.Split(d, ":")[0], "uploads")
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "strapd", "uploads")
	}
	if os.Geteuid() == 0 {
		return "/var/lib/strapd/uploads"
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "strapd", "uploads")
}

// manager builds the upload manager and the server's view of it (resumePending then takes
// up earlier runs' uploads). A configuration that
// does not load leaves uploads unavailable with the reason (sessions asking for one are
// refused with it); serve itself fails only when --upload was asked for.
func (c *uploadConfig) manager(ctx context.Context, log *zap.Logger) (*upload.Manager, server.Uploads, error) {
	su := server.Uploads{Endpoint: c.Client.Endpoint}
	for _, a := range c.Allow {
		t, _ := upload.ParseURL(a)
		su.Allowed = append(su.Allowed, t)
	}
	if c.Target != "" {
		t, _ := upload.ParseURL(c.Target)
		su.Default = &t
		su.Allowed = append(su.Allowed, t)
	}
	m, err := c.newManager(ctx, log)
	if err != nil {
		if c.Target != "" {
			return nil, su, err
		}
		log.Warn("uploads unavailable", zap.Error(err))
		su.Err = err
		return nil, su, nil
	}
	su.Manager = m
	return m, su, nil
}

// resumePending takes up the unfinished uploads of earlier runs. serve calls it only once
// it owns the socket: a daemon that lost the start to a live one must not upload what the
// live one is uploading.
func resumePending(m *upload.Manager, log *zap.Logger) {
	if m == nil {
		return
	}
	if err := m.ResumePending(); err != nil {
		log.Warn("some unfinished uploads cannot be resumed", zap.Error(err))
	}
}

func (c *uploadConfig) newManager(ctx context.Context, log *zap.Logger) (*upload.Manager, error) {
	client, err := upload.NewClient(ctx, c.Client)
	if err != nil {
		return nil, err
	}
	return upload.NewManager(upload.Options{Client: client, StateDir: c.stateDir(), PartSize: int64(c.PartSize),
		Concurrency: c.Concurrency, KeepLocal: c.KeepLocal, FreeLocal: c.FreeLocal, Log: log.With(zap.String("component", "upload"))})
}

// drainUploads gives the uploads still going when serve ends up to d to complete; the
// rest stop where they are and a restarted strapd completes them from their state files.
func drainUploads(m *upload.Manager, d time.Duration, log *zap.Logger) {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if !m.Wait(ctx) {
		log.Warn("exiting with uploads unfinished; the next strapd completes them", zap.Duration("waited", d))
	}
	_ = m.Close()
}

// newUploadCmd builds `strapd upload FILE s3://bucket/prefix`: one finished stream file
// (and the side files named after it) uploaded by the same code as a capture's.
func newUploadCmd(logger func() *zap.Logger) *cobra.Command {
	var c uploadConfig
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "upload FILE s3://bucket/prefix",
		Short: "Upload a finished capture stream (and its trace, resource log and tokens file beside it) to object storage",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.validate(); err != nil {
				return err
			}
			target, err := upload.ParseURL(args[1])
			if err != nil {
				return err
			}
			log := logger()
			if c.StateDir == "" && daemonStateOf(args[0], &c) {
				// strapd serve left an unfinished upload of this file: this one goes on from
				// its state, and removes it (and aborts what it orphaned) once complete.
				c.StateDir = c.stateDir()
				fmt.Fprintf(cmd.ErrOrStderr(), "strapd upload: continuing the upload strapd serve left in %s\n", c.StateDir)
			}
			if c.StateDir == "" {
				c.StateDir, err = os.MkdirTemp("", "strapd-upload-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(c.StateDir)
			}
			m, err := c.newManager(cmd.Context(), log)
			if err != nil {
				return err
			}
			defer m.Close()
			path, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			var sides []upload.SideFile
			for _, p := range sidePaths(path) {
				if sf, err := os.Open(p); err == nil {
					sides = append(sides, upload.SideFile{File: sf, Path: p})
				}
			}
			start := time.Now()
			u, err := m.Begin(upload.Stream{File: f, Path: path, Target: target, UID: uint32(os.Getuid()), Final: true})
			if err != nil {
				return err
			}
			// A capture's parts take their CRC32C from its packets' stored CRCs instead of
			// being read back whole (a file that is not a stream is read back).
			if fi, err := f.Stat(); err == nil {
				if src, err := upload.NewStreamCRCs(f, fi.Size(), m.PartSize()); err == nil {
					u.UseCRCs(src)
				}
			}
			if err := u.Finish(sides); err != nil {
				return err
			}
			// Failed attempts are retried with backoff; report each while waiting.
			var seen uint64
			for done := false; !done; {
				select {
				case <-u.Done():
					done = true
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(200 * time.Millisecond):
					if st := u.Status(); st.Errors > seen {
						seen = st.Errors
						fmt.Fprintf(cmd.ErrOrStderr(), "strapd upload: attempt failed (retrying): %s\n", st.LastError)
					}
				}
			}
			st := u.Status()
			if st.State != upload.StateComplete {
				return fmt.Errorf("upload of %s stopped: %s", path, st.LastError)
			}
			took := time.Since(start)
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				return enc.Encode(map[string]any{"object": st.Object, "bytes": st.FinalSize, "parts": st.Parts,
					"seconds": took.Seconds(), "verified": st.Verified})
			}
			fmt.Fprintf(out, "%s: %d bytes in %d parts, %.2fs (%.1f MB/s), verified: %s\n", st.Object, st.FinalSize, st.Parts,
				took.Seconds(), float64(st.FinalSize)/took.Seconds()/1e6, st.Verified)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Client.Endpoint, "s3-endpoint", "", "S3 API endpoint of a store other than AWS (path-style addressing)")
	f.StringVar(&c.Client.Region, "s3-region", "", "region to sign requests for")
	f.StringVar(&c.Client.Profile, "s3-profile", "", "shared config/credentials profile")
	addSSEFlags(f, &c.Client)
	addDeadlineFlags(f, &c.Client)
	c.PartSize = 16 << 20
	f.Var(&c.PartSize, "upload-part-size", "size of the first multipart parts (at least 5MiB)")
	f.IntVar(&c.Concurrency, "upload-concurrency", 4, "parts sent at once")
	f.StringVar(&c.StateDir, "upload-state-dir", "", "keep the upload's state here, so that running the same command again after a crash continues it (default: serve's default state directory when it holds an unfinished upload of FILE, which this one then continues and clears; else a temporary directory)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	c.KeepLocal = true
	return cmd
}

// daemonStateOf reports whether serve's default state directory (--upload-state-dir
// unset) holds an upload state of the file at path.
func daemonStateOf(path string, c *uploadConfig) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(c.stateDir(), upload.StateName(fi)))
	return err == nil
}

// openStreamSource opens a stream for inspect/verify: a local path, or an s3:// object
// read by range (the client configured the standard AWS way, endpoint from --s3-endpoint).
func openStreamSource(ctx context.Context, arg string, opts upload.ClientOptions, block int64) (io.ReaderAt, int64, func(), error) {
	if !strings.HasPrefix(arg, "s3://") {
		f, err := os.Open(arg)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("open stream: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, nil, fmt.Errorf("stat stream: %w", err)
		}
		return f, st.Size(), func() { f.Close() }, nil
	}
	c, err := upload.NewClient(ctx, opts)
	if err != nil {
		return nil, 0, nil, err
	}
	r, err := upload.OpenObject(ctx, c, arg, block)
	if err != nil {
		return nil, 0, nil, err
	}
	return r, r.Size(), func() {}, nil
}

// readFailed is the error of an object read that failed on the way (not damage in the
// object), or nil: inspect and verify then fail with it rather than report the object cut.
func readFailed(r io.ReaderAt) error {
	if o, ok := r.(*upload.ObjectReader); ok {
		return o.Err()
	}
	return nil
}

// addS3ReadFlags are inspect's and verify's flags for s3:// arguments.
func addS3ReadFlags(f *pflag.FlagSet, o *upload.ClientOptions) {
	f.StringVar(&o.Endpoint, "s3-endpoint", "", "for an s3:// argument: the S3 API endpoint of a store other than AWS (path-style addressing)")
	f.StringVar(&o.Region, "s3-region", "", "for an s3:// argument: region to sign requests for")
	f.StringVar(&o.Profile, "s3-profile", "", "for an s3:// argument: shared config/credentials profile")
}

// sidePaths are the files the Python client writes beside a stream (docs/OBJECT_STORAGE.md):
// the kernel trace, the resource log, the tokens file (<stem>_tokens.json for a .stream,
// else <path>_tokens.json, as clients/python's _capture_files.tokens_path names it) and the
// checkpoint (there only while the capture can still be resumed).
func sidePaths(path string) []string {
	tokens := path + "_tokens.json"
	if stem, ok := strings.CutSuffix(path, ".stream"); ok {
		tokens = stem + "_tokens.json"
	}
	return []string{path + ".trace.jsonl", path + ".resources.jsonl", tokens, checkpoint.DefaultPath(path)}
}
