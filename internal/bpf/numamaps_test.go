package bpf

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/strap-llm/strap/internal/trace"
)

func TestParseNUMAMaps(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join(testdataDir, "numa_maps", "two_nodes_huge"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   string
		want map[int]trace.NodePages
		bad  bool
	}{
		{name: "two nodes, a huge-page mapping, a mapping with nothing resident", in: string(golden), want: map[int]trace.NodePages{
			0: {Pages: 200 + 1 + 33, Bytes: (200+33)*4096 + 2<<20},
			1: {Pages: 100 + 512 + 2, Bytes: (100+512)*4096 + 2*2<<20},
		}},
		{name: "empty", in: "", want: map[int]trace.NodePages{}},
		{name: "blank lines", in: "\n\n", want: map[int]trace.NodePages{}},
		{name: "no trailing newline", in: "1000 default anon=1 N3=1 kernelpagesize_kB=4", want: map[int]trace.NodePages{3: {Pages: 1, Bytes: 4096}}},
		{name: "not an address", in: "zz default N0=1 kernelpagesize_kB=4\n", bad: true},
		{name: "no policy", in: "1000\n", bad: true},
		{name: "count not a number", in: "1000 default N0=x kernelpagesize_kB=4\n", bad: true},
		{name: "node counts without a page size", in: "1000 default N0=1\n", bad: true},
		{name: "page size zero", in: "1000 default N0=1 kernelpagesize_kB=0\n", bad: true},
		{name: "overflow", in: "1000 default N0=18446744073709551615 kernelpagesize_kB=4\n", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseNUMAMaps([]byte(tc.in))
			if tc.bad {
				if !errors.Is(err, ErrBadNUMAMaps) {
					t.Fatalf("got %v, %v; want ErrBadNUMAMaps", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
