package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/trace"
)

// DefaultNUMAMapsInterval is how often a watched process's /proc/<pid>/numa_maps is read
// when Options.NUMAMapsInterval is 0.
const DefaultNUMAMapsInterval = 30 * time.Second

// ErrBadNUMAMaps is returned for /proc/<pid>/numa_maps content that does not parse.
var ErrBadNUMAMaps = errors.New("malformed numa_maps")

// parseNUMAMaps sums /proc/<pid>/numa_maps by node: each line is a mapping's start
// address, its memory policy, then space-separated tokens, among them N<node>=<pages> for
// every node with resident pages and kernelpagesize_kB=<size> (paths are escaped by the
// kernel, so a file name holds no space). An empty file (a kernel thread, a process that
// just exited) gives an empty map.
func parseNUMAMaps(b []byte) (map[int]trace.NodePages, error) {
	out := map[int]trace.NodePages{}
	type nodeCount struct {
		node  int
		pages uint64
	}
	var counts []nodeCount
	for ln := 1; len(b) > 0; ln++ {
		var line []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			line, b = b, nil
		}
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if _, err := strconv.ParseUint(string(fields[0]), 16, 64); err != nil || len(fields) < 2 {
			return nil, fmt.Errorf("%w: line %d: want an address and a policy, got %q", ErrBadNUMAMaps, ln, clip(line))
		}
		counts = counts[:0]
		var pageKB uint64
		for _, f := range fields[2:] {
			k, v, ok := bytes.Cut(f, []byte{'='})
			if !ok {
				continue // flags such as "huge" or "anon=…"'s neighbours without a value
			}
			switch {
			case len(k) > 1 && k[0] == 'N' && k[1] >= '0' && k[1] <= '9':
				node, err := strconv.Atoi(string(k[1:]))
				if err != nil {
					return nil, fmt.Errorf("%w: line %d: node %q", ErrBadNUMAMaps, ln, k)
				}
				n, err := strconv.ParseUint(string(v), 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: line %d: %s=%q", ErrBadNUMAMaps, ln, k, clip(v))
				}
				counts = append(counts, nodeCount{node, n})
			case string(k) == "kernelpagesize_kB":
				n, err := strconv.ParseUint(string(v), 10, 64)
				if err != nil || n == 0 || n > 1<<30 {
					return nil, fmt.Errorf("%w: line %d: kernelpagesize_kB=%q", ErrBadNUMAMaps, ln, clip(v))
				}
				pageKB = n
			}
		}
		if len(counts) > 0 && pageKB == 0 {
			return nil, fmt.Errorf("%w: line %d: node counts without kernelpagesize_kB", ErrBadNUMAMaps, ln)
		}
		for _, c := range counts {
			if c.pages > (1<<64-1)/(pageKB<<10) {
				return nil, fmt.Errorf("%w: line %d: N%d=%d pages overflow", ErrBadNUMAMaps, ln, c.node, c.pages)
			}
			np := out[c.node]
			add := c.pages * pageKB << 10
			if np.Bytes+add < np.Bytes {
				return nil, fmt.Errorf("%w: line %d: node %d's bytes overflow", ErrBadNUMAMaps, ln, c.node)
			}
			np.Pages += c.pages
			np.Bytes += add
			out[c.node] = np
		}
	}
	return out, nil
}

func clip(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// readNUMAMaps reads pid's resident pages per NUMA node, keyed by decimal node number.
func readNUMAMaps(procRoot string, pid int) (map[string]trace.NodePages, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "numa_maps"))
	if err != nil {
		return nil, err
	}
	nodes, err := parseNUMAMaps(b)
	if err != nil {
		return nil, fmt.Errorf("proc %d: %w", pid, err)
	}
	out := make(map[string]trace.NodePages, len(nodes))
	for n, p := range nodes {
		out[strconv.Itoa(n)] = p
	}
	return out, nil
}

// numaPages adds pid's resident pages per node to s when its last reading (or its Watch)
// is at least the interval old: numa_maps walks the process's page tables under its mmap
// lock (about 20 ms of system time for a torch process with a small model and 1000
// mappings, more for a model of many GB), not a cost to pay every snapshot.
func (c *Collector) numaPages(s *trace.Snapshot, pid int, key string) {
	every := c.numaEvery()
	if every < 0 {
		return
	}
	now := time.Now()
	if last, ok := c.numaRead[pid]; ok && now.Sub(last) < every {
		return
	}
	c.numaRead[pid] = now
	nodes, err := readNUMAMaps(c.opts.ProcRoot, pid)
	if err != nil {
		if errors.Is(err, ErrBadNUMAMaps) {
			c.log.Warn("numa_maps not read", zap.Int("pid", pid), zap.Error(err))
		}
		return // no numa_maps (a kernel without NUMA), or the process exited meanwhile
	}
	if s.NUMAPages == nil {
		s.NUMAPages = map[string]map[string]trace.NodePages{}
	}
	s.NUMAPages[key] = nodes
}

// numaEvery is the interval between numa_maps readings of one process (negative: never).
func (c *Collector) numaEvery() time.Duration {
	if every := c.opts.NUMAMapsInterval; every != 0 {
		return every
	}
	return DefaultNUMAMapsInterval
}

// pruneNUMARead forgets the reading times of processes that are neither watched nor
// reported now and whose interval is over (one reported later is read at once, as it
// would be anyway), so the map does not grow with every client that came and went.
func (c *Collector) pruneNUMARead(reported map[int]bool) {
	every := c.numaEvery()
	now := time.Now()
	for pid, at := range c.numaRead {
		if !reported[pid] && !c.watched[pid] && (every < 0 || now.Sub(at) >= every) {
			delete(c.numaRead, pid)
		}
	}
}
