// Command ingest is the Go synthetic producer of `make bench` (docs/PERFORMANCE.md): it
// opens one session on a running strapd, pushes float32 activation-like tensors through a
// shm.Producer ring exactly as the Python client does (one copy into the ring, PUBLISH,
// wait for RELEASE under policy block) until -bytes have gone in, closes, and prints one
// JSON line with what the daemon reported and how long it took.
//
//	go run ./bench/ingest -socket /tmp/s/strapd.sock -out /tmp/s/x.strap -codec none -bytes 2GiB
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

func main() { os.Exit(run()) }

// result is the JSON line printed on success.
type result struct {
	Producer   string  `json:"producer"`
	Codec      string  `json:"codec"`
	Level      int     `json:"level"`
	Lossy      string  `json:"lossy,omitempty"`
	TensorMiB  int     `json:"tensor_mib"`
	RingMiB    int     `json:"ring_mib"`
	BlockSize  uint64  `json:"block_size"`
	Tensors    int     `json:"tensors"`
	Packets    uint64  `json:"packets"`
	Drops      uint64  `json:"drops"`
	BytesIn    uint64  `json:"bytes_in"`
	BytesOut   uint64  `json:"bytes_out"`
	FileBytes  uint64  `json:"file_bytes"`
	Seconds    float64 `json:"seconds"`
	PutSeconds float64 `json:"put_seconds"`
	GBps       float64 `json:"gbps"`
	ClientCPU  float64 `json:"client_cpu_s"`
	ClientRSS  int64   `json:"client_maxrss_bytes"`
}

func run() int {
	socket := flag.String("socket", "", "strapd control socket (required)")
	out := flag.String("out", "", "output stream file, created/truncated (required)")
	codecName := flag.String("codec", "none", "session codec (none, lz4, zstd, shuffle, ...)")
	level := flag.Int("level", 0, "codec level")
	total := flag.String("bytes", "1GiB", "raw bytes to push (suffixes KiB MiB GiB)")
	tensorMiB := flag.Int("tensor-mib", 4, "MiB per tensor")
	ringMiB := flag.Int("ring-mib", 256, "ring size in MiB (plus the 4 KiB header)")
	distinct := flag.Int("distinct", 8, "distinct tensors cycled through (defeats the CPU cache)")
	block := flag.Uint64("block-size", 1<<20, "compression block size asked for in OPEN")
	lossySpec := flag.String("lossy", "", "error bound of a lossy codec, MODE:VALUE (rel:1e-3, abs:1e-2, fp16)")
	flag.StringVar(&uploadTarget, "upload", "", "OPEN's upload target, s3://bucket/prefix (bench/upload.py's capture A/B)")
	flag.Parse()
	if *socket == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "ingest: -socket and -out are required")
		return 2
	}
	want, err := parseSize(*total)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ingest: -bytes: %v\n", err)
		return 2
	}
	if *tensorMiB <= 0 || *ringMiB <= 0 || *distinct <= 0 {
		fmt.Fprintln(os.Stderr, "ingest: -tensor-mib, -ring-mib and -distinct must be positive")
		return 2
	}
	lossy, err := parseLossy(*lossySpec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ingest: -lossy: %v\n", err)
		return 2
	}
	r, err := push(*socket, *out, *codecName, *level, lossy, want, *tensorMiB, *ringMiB, *distinct, *block)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ingest: %v\n", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintf(os.Stderr, "ingest: %v\n", err)
		return 1
	}
	return 0
}

// uploadTarget is -upload: the session uploads its stream there (empty: no upload).
var uploadTarget string

func push(socket, out, codecName string, level int, lossy *control.Lossy, want uint64, tensorMiB, ringMiB, distinct int, block uint64) (result, error) {
	elems := tensorMiB << 20 / 4
	tensors := make([]shm.Tensor, distinct)
	for i := range tensors {
		tensors[i] = shm.Tensor{Name: fmt.Sprintf("model.layers.%d.mlp", i), DType: dtype.Float32,
			Shape: []uint64{1, uint64(elems / 1024), 1024}, Payload: pipelinetest.Activations(uint64(i+1), elems)}
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return result{}, fmt.Errorf("create output: %w", err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, socket, "strap-bench-ingest/1")
	if err != nil {
		return result{}, fmt.Errorf("dial: %w", err)
	}
	defer c.Disconnect()
	ringSize := uint64(shm.HeaderSize) + uint64(ringMiB)<<20
	start := time.Now()
	st, opened, err := controltest.OpenStream(c, ringSize, f, control.Open{Codec: codecName, CodecLevel: level,
		Policy: "block", BlockSize: block, Lossy: lossy, Upload: uploadTarget,
		Metadata: map[string]any{"model_class": "synthetic", "producer": "bench/ingest"}})
	if err != nil {
		return result{}, fmt.Errorf("open: %w", err)
	}
	var pushed uint64
	n := 0
	for pushed < want {
		t := &tensors[n%distinct]
		t.Forward = uint64(n)
		if err := st.Put(t); err != nil {
			st.Finish()
			return result{}, fmt.Errorf("put tensor %d: %w", n, err)
		}
		pushed += uint64(len(t.Payload))
		n++
	}
	putDone := time.Now()
	cl, err := st.Finish()
	if err != nil {
		return result{}, fmt.Errorf("finish: %w", err)
	}
	secs := time.Since(start).Seconds()
	if cl.BytesIn != pushed || cl.Drops != 0 {
		return result{}, fmt.Errorf("daemon took %d bytes with %d drops, pushed %d: %w", cl.BytesIn, cl.Drops, pushed, errLost)
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return result{
		Producer: "go", Codec: codecName, Level: level, Lossy: lossyString(lossy), TensorMiB: tensorMiB, RingMiB: ringMiB,
		BlockSize: opened.BlockSize, Tensors: n, Packets: cl.Packets, Drops: cl.Drops,
		BytesIn: cl.BytesIn, BytesOut: cl.BytesOut, FileBytes: cl.FileBytes,
		Seconds: secs, PutSeconds: putDone.Sub(start).Seconds(), GBps: float64(cl.BytesIn) / secs / 1e9,
		ClientCPU: tv(ru.Utime) + tv(ru.Stime), ClientRSS: int64(ru.Maxrss) * 1024,
	}, nil
}

// errLost reports a session that did not keep every byte pushed.
var errLost = errors.New("bytes lost")

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// parseSize reads 4096, 64KiB, 2GiB (binary suffixes only: the sizes here are buffers).
func parseSize(s string) (uint64, error) {
	mult := uint64(1)
	for _, u := range []struct {
		suf string
		m   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return uint64(v * float64(mult)), nil
}

// parseLossy reads MODE:VALUE ("rel:1e-3", "abs:0.01") or "fp16"; "" is no bound.
func parseLossy(s string) (*control.Lossy, error) {
	if s == "" {
		return nil, nil
	}
	mode, val, found := strings.Cut(s, ":")
	if !found {
		if mode != "fp16" {
			return nil, fmt.Errorf("bad bound %q: want MODE:VALUE or fp16", s)
		}
		return &control.Lossy{Mode: mode}, nil
	}
	v, err := strconv.ParseFloat(val, 64)
	if err != nil || !(v > 0) {
		return nil, fmt.Errorf("bad bound value in %q", s)
	}
	return &control.Lossy{Mode: mode, Value: v}, nil
}

func lossyString(l *control.Lossy) string {
	if l == nil {
		return ""
	}
	if l.Value == 0 {
		return l.Mode
	}
	return fmt.Sprintf("%s:%g", l.Mode, l.Value)
}
