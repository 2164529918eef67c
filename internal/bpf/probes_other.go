//go:build !(linux && (amd64 || arm64))

package bpf

import (
	"fmt"
	"runtime"

	"github.com/strap-llm/strap/internal/trace"
)

// probes is absent on this platform; every collector uses its /proc fallback or is off.
type probes struct{ statsErr string }

// loadProbes names the build's platform so that `strapd status` on, say, the arm64 binary
// of a wheel says why there is no histogram rather than only that there is none.
func loadProbes(uint32) (*probes, map[string]error, error) {
	return nil, nil, fmt.Errorf("%w; this strapd is %s/%s, without the eBPF object", ErrUnsupported, runtime.GOOS, runtime.GOARCH)
}

func (p *probes) read(bool) (rawCounters, error)              { return rawCounters{}, nil }
func (p *probes) drainOpens(int) ([]trace.DeviceOpen, uint64) { return nil, 0 }
func (p *probes) watch(uint32) error                          { return ErrUnsupported }
func (p *probes) unwatch(uint32) error                        { return nil }
func (p *probes) watchCgroup(uint64) error                    { return ErrUnsupported }
func (p *probes) forgetProcess(uint32)                        {}
func (p *probes) forgetThread(uint32)                         {}
func (p *probes) forgetPending(uint32)                        {}
func (p *probes) sweepThreads(func(uint32) bool)              {}
func (p *probes) close() error                                { return nil }

func (p *probes) procTotals(uint32) (ProcessTotals, error) { return ProcessTotals{}, ErrUnsupported }
func (p *probes) procTotalsKernel(uint32) (ProcessTotals, error) {
	return ProcessTotals{}, ErrUnsupported
}
func (p *probes) watchTotals(uint32) error { return ErrUnsupported }

func (p *probes) setCPUNodes(map[int]int) error { return ErrUnsupported }

func (p *probes) takeWeightOpen(uint32) (weightOpen, bool, error) {
	return weightOpen{}, false, ErrUnsupported
}
