package server

import (
	"errors"
	"reflect"
	"testing"

	"github.com/strap-llm/strap/internal/control"
)

// TestNamedOpenFDs: OPEN's descriptors get their roles by docs/PROTOCOL.md 1.3's order (ring,
// output, optional trace, resource log last when "resources": true), and a count that does
// not fit the body is bad_message.
func TestNamedOpenFDs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fds       []int
		resources bool
		want      openFDs
		sides     []int
		bad       bool
	}{
		{name: "ring and output", fds: []int{10, 11}, want: openFDs{ring: 10, output: 11, trace: -1, resourceLog: -1}},
		{name: "with trace", fds: []int{10, 11, 12}, want: openFDs{ring: 10, output: 11, trace: 12, resourceLog: -1}, sides: []int{12}},
		{name: "resource log third", fds: []int{10, 11, 12}, resources: true, want: openFDs{ring: 10, output: 11, trace: -1, resourceLog: 12}, sides: []int{12}},
		{name: "trace and resource log", fds: []int{10, 11, 12, 13}, resources: true, want: openFDs{ring: 10, output: 11, trace: 12, resourceLog: 13}, sides: []int{12, 13}},
		{name: "one", fds: []int{10}, bad: true},
		{name: "none", bad: true},
		{name: "five", fds: []int{10, 11, 12, 13, 14}, resources: true, bad: true},
		{name: "four without resources", fds: []int{10, 11, 12, 13}, bad: true},
		{name: "resources without a log", fds: []int{10, 11}, resources: true, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := namedOpenFDs(tc.fds, tc.resources)
			if tc.bad {
				var ce *control.Error
				if !errors.As(err, &ce) || ce.Code != control.CodeBadMessage {
					t.Fatalf("namedOpenFDs(%v, %v) = %+v, %v; want a bad_message error", tc.fds, tc.resources, got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("namedOpenFDs(%v, %v) = %+v, want %+v", tc.fds, tc.resources, got, tc.want)
			}
			if s := got.sides(); !reflect.DeepEqual(s, tc.sides) {
				t.Fatalf("sides() = %v, want %v", s, tc.sides)
			}
		})
	}
}
