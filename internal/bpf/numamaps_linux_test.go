//go:build linux

package bpf

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/trace"
)

// holdPages maps n 4 KiB pages without transparent huge pages, writes each and waits for
// stdin to close.
const holdPages = `import mmap, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, n * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
for i in range(n):
    m[i * 4096] = 1
sys.stdin.read()
`

// TestNUMAPages: a process holding 64 MiB of 4 KiB pages it wrote shows at least that
// resident, all on node 0 on a one-node machine, at most its RSS plus what numa_maps
// counts twice (a page mapped by two mappings); read again only once the interval passed.
func TestNUMAPages(t *testing.T) {
	if _, err := os.Stat("/proc/self/numa_maps"); err != nil {
		t.Skipf("skipping: kernel without numa_maps: %v", err)
	}
	py := python(t)
	const mib = 64
	const every = 2 * time.Second
	g := startGated(t, fmt.Sprintf("%s -c '%s' %d", py, holdPages, mib<<8))
	c, err := Start(Options{NoBPF: true, NUMAMapsInterval: every})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Watch(g.pid); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(g.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	key := strconv.Itoa(g.pid)
	var got map[string]trace.NodePages
	var rss uint64
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(every + 50*time.Millisecond)
		s := c.Snapshot()
		got, rss = s.NUMAPages[key], s.Memory[key].RSSBytes
		if got["0"].Bytes >= mib<<20 {
			break
		}
	}
	t.Logf("numa_pages %+v, rss %d", got, rss)
	var total uint64
	for _, p := range got {
		total += p.Bytes
	}
	if total < mib<<20 {
		t.Fatalf("resident %d bytes over the nodes, want >= %d MiB", total, mib)
	}
	if nodes, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*"); len(nodes) == 1 {
		if len(got) != 1 || got["0"].Bytes != total {
			t.Fatalf("one-node machine: %+v, want node 0 only", got)
		}
	}
	if rss > 0 && total > rss+rss/4 {
		t.Fatalf("resident %d bytes, more than the RSS %d", total, rss)
	}
	// Within the interval no second reading; after it, one.
	if s := c.Snapshot(); s.NUMAPages[key] != nil {
		t.Fatalf("numa_pages read again within the interval")
	}
	time.Sleep(every + 50*time.Millisecond)
	if s := c.Snapshot(); s.NUMAPages[key] == nil {
		t.Fatalf("numa_pages not read after the interval")
	}
	g.stdin.Close()
}
