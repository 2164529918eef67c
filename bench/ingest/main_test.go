package main

import "testing"

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		err  bool
	}{
		{"4096", 4096, false},
		{"64KiB", 64 << 10, false},
		{"2GiB", 2 << 30, false},
		{"1.5MiB", 3 << 19, false},
		{"0", 0, true},
		{"-1MiB", 0, true},
		{"lots", 0, true},
		{"", 0, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseSize(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("parseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestParseLossy(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  bool
	}{
		{"", "", false},
		{"rel:1e-3", "rel:0.001", false},
		{"abs:0.01", "abs:0.01", false},
		{"fp16", "fp16", false},
		{"rel", "", true},
		{"rel:0", "", true},
		{"rel:x", "", true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			l, err := parseLossy(tc.in)
			if (err != nil) != tc.err || lossyString(l) != tc.want {
				t.Fatalf("parseLossy(%q) = %q, %v; want %q, error %v", tc.in, lossyString(l), err, tc.want, tc.err)
			}
		})
	}
}
