package trace

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestReadersDoNotLinkBPF holds ARCHITECTURE.md's boundary: the format package and the
// packages that only read snapshots (metrics, httpapi) never import the package that loads
// eBPF programs, nor cilium/ebpf.
func TestReadersDoNotLinkBPF(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list imports with")
	}
	for _, pkg := range []string{"internal/trace", "internal/metrics", "internal/httpapi"} {
		t.Run(pkg, func(t *testing.T) {
			out, err := exec.Command(gobin, "list", "-deps", "github.com/strap-llm/strap/"+pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			deps := strings.Fields(string(out))
			for _, bad := range []string{"github.com/strap-llm/strap/internal/bpf", "github.com/cilium/ebpf"} {
				if slices.Contains(deps, bad) {
					t.Errorf("%s imports %s", pkg, bad)
				}
			}
		})
	}
}
