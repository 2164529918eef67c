package codec

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"
)

// goldenTable is testdata/codec-table/codecs.json: the codec table Go, Python and libstrap
// each check themselves against.
type goldenTable struct {
	Version int `json:"version"`
	Codecs  []struct {
		Name       string   `json:"name"`
		ID         int      `json:"id"`
		Levels     [2]int   `json:"levels"`
		LossyModes []string `json:"lossy_modes"`
	} `json:"codecs"`
}

// TestCodecTable fails when the registered codecs drift from the golden codec table: a codec
// missing on either side, another number, another level range or other lossy modes.
func TestCodecTable(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/codec-table/codecs.json")
	if err != nil {
		t.Fatal(err)
	}
	var g goldenTable
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		t.Fatalf("codecs.json: %v", err)
	}
	if g.Version != 1 {
		t.Fatalf("codecs.json version %d, this test reads 1", g.Version)
	}
	var names []string
	allModes := map[string]bool{"abs": true, "rel": true, "fp16": true, "fp8": true, "bogus": true}
	for _, c := range g.Codecs {
		names = append(names, c.Name)
		for _, m := range c.LossyModes {
			allModes[m] = true
		}
	}
	slices.Sort(names)
	if got := Names(); !slices.Equal(got, names) {
		t.Fatalf("registered codecs %v, codecs.json lists %v", got, names)
	}
	for _, c := range g.Codecs {
		t.Run(c.Name, func(t *testing.T) {
			lo, hi := c.Levels[0], c.Levels[1]
			for l := lo; l <= hi; l++ {
				cd, err := New(c.Name, Options{Level: l})
				if err != nil {
					t.Fatalf("level %d (in %d..%d): %v", l, lo, hi, err)
				}
				if int(cd.ID()) != c.ID || cd.Name() != c.Name {
					t.Fatalf("New(%q) is %s id %d, codecs.json says id %d", c.Name, cd.Name(), cd.ID(), c.ID)
				}
			}
			for _, l := range []int{lo - 1, hi + 1} {
				if _, err := New(c.Name, Options{Level: l}); !errors.Is(err, ErrBadLevel) {
					t.Errorf("level %d (outside %d..%d): err %v, want ErrBadLevel", l, lo, hi, err)
				}
			}
			if byID, err := ByID(ID(c.ID)); err != nil || byID.Name() != c.Name {
				t.Errorf("ByID(%d) = %v, %v; want %s", c.ID, byID, err, c.Name)
			}
			for m := range allModes {
				// 0.01 suits every mode: abs and rel need > 0, fp16 and fp8 take a cap ≥ 0.
				_, err := New(c.Name, Options{Lossy: &LossyBound{Mode: m, Value: 0.01}})
				if want := slices.Contains(c.LossyModes, m); want != (err == nil) {
					t.Errorf("lossy mode %q: err %v; codecs.json lists %v", m, err, c.LossyModes)
				}
			}
		})
	}
}
