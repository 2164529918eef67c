//go:build linux && (amd64 || arm64)

package bpf

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// otherObject is the committed object of the other architecture, read from the package
// directory (the test's working directory).
var otherObject = map[string]string{"amd64": "strap_arm64_bpfel.o", "arm64": "strap_x86_bpfel.o"}

// TestObjectSpec checks the object embedded for this GOARCH without a kernel (it parses
// the ELF only, so it also runs under qemu-user, where nothing can be loaded): every
// program and map the generated code names is there; programs, maps and variables match
// the other architecture's object one for one, with the same program, attach and map
// types, sizes and flags; every nr_* constant is set by the loader; and the syscall
// probes read this architecture's registers.
func TestObjectSpec(t *testing.T) {
	spec, err := loadStrap()
	if err != nil {
		t.Fatal(err)
	}
	var specs strapSpecs
	if err := spec.Assign(&specs); err != nil {
		t.Fatalf("embedded object lacks a program or map the generated code names: %v", err)
	}
	other, err := ebpf.LoadCollectionSpec(otherObject[runtime.GOARCH])
	if err != nil {
		t.Fatal(err)
	}

	t.Run("programs", func(t *testing.T) {
		if got, want := sortedKeys(spec.Programs), sortedKeys(other.Programs); !slices.Equal(got, want) {
			t.Fatalf("programs %v, other object has %v", got, want)
		}
		for name, p := range spec.Programs {
			o := other.Programs[name]
			if p.Type == ebpf.UnspecifiedProgram || p.Type != o.Type || p.AttachType != o.AttachType ||
				p.SectionName != o.SectionName || p.AttachTo != o.AttachTo || p.License != o.License {
				t.Errorf("%s: %v/%v %q %q, other object %v/%v %q %q", name, p.Type, p.AttachType, p.SectionName,
					p.AttachTo, o.Type, o.AttachType, o.SectionName, o.AttachTo)
			}
			if len(p.Instructions) == 0 {
				t.Errorf("%s: no instructions", name)
			}
		}
	})
	t.Run("maps", func(t *testing.T) {
		if got, want := sortedKeys(spec.Maps), sortedKeys(other.Maps); !slices.Equal(got, want) {
			t.Fatalf("maps %v, other object has %v", got, want)
		}
		for name, m := range spec.Maps {
			o := other.Maps[name]
			if m.Type == ebpf.UnspecifiedMap || m.Type != o.Type || m.KeySize != o.KeySize ||
				m.ValueSize != o.ValueSize || m.MaxEntries != o.MaxEntries || m.Flags != o.Flags {
				t.Errorf("%s: %v key %d value %d max %d flags %#x, other object %v key %d value %d max %d flags %#x",
					name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags, o.Type, o.KeySize, o.ValueSize, o.MaxEntries, o.Flags)
			}
		}
	})
	t.Run("variables", func(t *testing.T) {
		if got, want := sortedKeys(spec.Variables), sortedKeys(other.Variables); !slices.Equal(got, want) {
			t.Fatalf("variables %v, other object has %v", got, want)
		}
		for name := range spec.Variables {
			if _, ok := syscallNrs[name]; strings.HasPrefix(name, "nr_") && !ok {
				t.Errorf("%s keeps its x86_64 default: not in syscallNrs", name)
			}
		}
		for name := range syscallNrs {
			if _, ok := spec.Variables[name]; !ok {
				t.Errorf("syscallNrs sets %s, which the object lacks", name)
			}
		}
		if err := setSyscallNrs(spec.Copy()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("registers", func(t *testing.T) {
		// The structs the CO-RE relocations of the syscall probes name: the kernel's own
		// (the flavour suffix dropped) must be this architecture's.
		want := map[string][]string{
			"amd64": {"pt_regs"},
			"arm64": {"pt_regs___strap", "user_pt_regs"},
		}[runtime.GOARCH]
		for _, prog := range []string{"sys_enter", "sys_exit"} {
			p := spec.Programs[prog]
			var got []string
			for i := range p.Instructions {
				if cr := btf.CORERelocationMetadata(&p.Instructions[i]); cr != nil {
					for _, s := range []string{"pt_regs", "pt_regs___strap", "user_pt_regs"} {
						if strings.Contains(cr.String(), `"`+s+`"`) && !slices.Contains(got, s) {
							got = append(got, s)
						}
					}
				}
			}
			slices.Sort(got)
			if prog == "sys_exit" && runtime.GOARCH == "arm64" {
				want = []string{"pt_regs___strap"} // only the number is read at exit
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: CO-RE relocations on %v, want %v (%s registers)", prog, got, want, runtime.GOARCH)
			}
		}
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
