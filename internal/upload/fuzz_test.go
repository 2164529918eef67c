package upload

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"github.com/aws/smithy-go"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseState: any bytes from the state directory either parse into a state that passes
// every check and survives a round trip, or fail with ErrBadState; never a panic.
func FuzzParseState(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/state/*.json")
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"version":1`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseState(b)
		if err != nil {
			return
		}
		if err := s.check(); err != nil {
			t.Fatalf("parsed state fails its check: %v", err)
		}
		again, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := ParseState(again)
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if s2.uploaded() != s.uploaded() || len(s2.Parts) != len(s.Parts) || s2.FinalSize != s.FinalSize ||
			s2.Completing != s.Completing || len(s2.objectParts()) != len(s.objectParts()) || len(s2.Copy) != len(s.Copy) ||
			(s2.Source == nil) != (s.Source == nil) || s2.Completed != s.Completed || s2.Capture != s.Capture || s2.Sweep != s.Sweep {
			t.Fatal("round trip changed the state")
		}
	})
}

// tail is a one-part state with the given final size and completion fields.
func tail(final, completion string) string {
	return `{"version":1,"bucket":"caps","key":"k","upload_id":"u","part_size":5242880,"path":"/a",` + final +
		`,"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAAAAA=="}],` + completion + `}`
}

// TestParseStateSeeds: every seed in testdata/state is a valid state.
func TestParseStateSeeds(t *testing.T) {
	seeds, _ := filepath.Glob("testdata/state/*.json")
	if len(seeds) < 4 {
		t.Fatalf("seeds: %v", seeds)
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseState(b); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestParseStateRejects(t *testing.T) {
	for _, ok := range []string{
		tail(`"final_size":5242890`, `"completing":true,"tail":{"number":2,"size":10,"etag":"g","crc32c":"AAAAAA=="}`),
		tail(`"final_size":5242880`, `"completing":true`),
	} {
		if _, err := ParseState([]byte(ok)); err != nil {
			t.Fatalf("good completing state refused: %v: %s", err, ok)
		}
	}
	good := `{"version":1,"bucket":"caps","key":"run/a/s.strap","upload_id":"u1","part_size":5242880,"path":"/tmp/s.strap","dev":1,"ino":2,"final_size":-1,"keep_local":true,"sides":[],"parts":[{"number":1,"size":5242880,"etag":"\"e\"","crc32c":"AAAAAA=="}]}`
	if _, err := ParseState([]byte(good)); err != nil {
		t.Fatalf("good state refused: %v", err)
	}
	for name, b := range map[string]string{
		"unknown field":             `{"version":1,"bogus":1}`,
		"version":                   `{"version":2,"bucket":"caps","key":"k","part_size":5242880,"path":"/a","final_size":-1}`,
		"small part size":           `{"version":1,"bucket":"caps","key":"k","part_size":1024,"path":"/a","final_size":-1}`,
		"relative path":             `{"version":1,"bucket":"caps","key":"k","part_size":5242880,"path":"a","final_size":-1}`,
		"part gap":                  `{"version":1,"bucket":"caps","key":"k","upload_id":"u","part_size":5242880,"path":"/a","final_size":-1,"parts":[{"number":2,"size":5242880,"etag":"e","crc32c":"AAAAAA=="}]}`,
		"part size":                 `{"version":1,"bucket":"caps","key":"k","upload_id":"u","part_size":5242880,"path":"/a","final_size":-1,"parts":[{"number":1,"size":5,"etag":"e","crc32c":"AAAAAA=="}]}`,
		"past final":                `{"version":1,"bucket":"caps","key":"k","upload_id":"u","part_size":5242880,"path":"/a","final_size":100,"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAAAAA=="}]}`,
		"bad crc":                   `{"version":1,"bucket":"caps","key":"k","upload_id":"u","part_size":5242880,"path":"/a","final_size":-1,"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAA"}]}`,
		"no upload id":              `{"version":1,"bucket":"caps","key":"k","part_size":5242880,"path":"/a","final_size":-1,"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAAAAA=="}]}`,
		"bucket":                    `{"version":1,"bucket":"Caps!","key":"k","part_size":5242880,"path":"/a","final_size":-1}`,
		"trailing data":             good + `{}`,
		"tail, not completing":      tail(`"final_size":5242890`, `"tail":{"number":2,"size":10,"etag":"g","crc32c":"AAAAAA=="}`),
		"completing, no final":      tail(`"final_size":-1`, `"completing":true`),
		"completing, short":         tail(`"final_size":5242890`, `"completing":true`),
		"completing, long":          tail(`"final_size":5242880`, `"completing":true,"tail":{"number":2,"size":10,"etag":"g","crc32c":"AAAAAA=="}`),
		"tail number":               tail(`"final_size":5242890`, `"completing":true,"tail":{"number":3,"size":10,"etag":"g","crc32c":"AAAAAA=="}`),
		"tail etag":                 tail(`"final_size":5242890`, `"completing":true,"tail":{"number":2,"size":10,"etag":"","crc32c":"AAAAAA=="}`),
		"tail crc":                  tail(`"final_size":5242890`, `"completing":true,"tail":{"number":2,"size":10,"etag":"g","crc32c":"AA"}`),
		"completed, not completing": tail(`"final_size":5242880`, `"completed":"\"e\""`),
		"copy without source":       tail(`"final_size":-1`, `"copy":[{"number":2,"size":5242880,"etag":"f","crc32c":"AAAAAA=="}]`),
		"copy not the source's": tail(`"final_size":-1`, `"copy":[{"number":2,"size":5242880,"etag":"f","crc32c":"AQIDBA=="}],`+
			`"source":{"upload_id":"u0","size":10485760,"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAAAAA=="},{"number":2,"size":5242880,"etag":"f","crc32c":"AAAAAA=="}]}`),
		"source size":             tail(`"final_size":-1`, `"source":{"upload_id":"u0","size":10485761,"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAAAAA=="},{"number":2,"size":5242880,"etag":"f","crc32c":"AAAAAA=="}]}`),
		"source short part":       tail(`"final_size":-1`, `"source":{"upload_id":"u0","size":5242890,"parts":[{"number":1,"size":10,"etag":"e","crc32c":"AAAAAA=="},{"number":2,"size":5242880,"etag":"f","crc32c":"AAAAAA=="}]}`),
		"capture not hex":         tail(`"final_size":-1`, `"capture":"3F0C"`),
		"capture too long":        tail(`"final_size":-1`, `"capture":"`+strings.Repeat("a", 65)+`"`),
		"source while completing": tail(`"final_size":5242880`, `"completing":true,"source":{"upload_id":"u0","size":5242880,"parts":[{"number":1,"size":5242880,"etag":"e","crc32c":"AAAAAA=="}]}`),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseState([]byte(b)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestPartSchedule(t *testing.T) {
	base := int64(16 << 20)
	if partStart(base, 1) != 0 || partSize(base, 1) != base || partSize(base, 1000) != base || partSize(base, 1001) != 2*base {
		t.Fatal("schedule")
	}
	// 10,000 parts from 16 MiB cover S3's 5 TiB object limit, none above 5 GiB.
	if end := partStart(base, MaxParts+1); end < 5<<40 {
		t.Fatalf("10,000 parts end at %d", end)
	}
	for n := int32(1); n <= MaxParts; n++ {
		if s := partSize(base, n); s > MaxPartSize || s < base {
			t.Fatalf("part %d: %d bytes", n, s)
		}
	}
}

func TestParseURL(t *testing.T) {
	for in, want := range map[string]Target{
		"s3://caps":          {Bucket: "caps"},
		"s3://caps/":         {Bucket: "caps"},
		"s3://caps/run/a/":   {Bucket: "caps", Prefix: "run/a"},
		"s3://my.bucket-1/x": {Bucket: "my.bucket-1", Prefix: "x"},
	} {
		got, err := ParseURL(in)
		if err != nil || got != want {
			t.Errorf("%s: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "caps/x", "s3://", "s3://ab", "s3://Caps", "s3://caps/a//b", "s3://caps/../x", "http://caps/x"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestTargetContains(t *testing.T) {
	fleet := Target{Bucket: "caps", Prefix: "fleet"}
	for _, tc := range []struct {
		o    Target
		want bool
	}{
		{Target{Bucket: "caps", Prefix: "fleet"}, true},
		{Target{Bucket: "caps", Prefix: "fleet/host3"}, true},
		{Target{Bucket: "caps", Prefix: "fleetwide"}, false},
		{Target{Bucket: "caps"}, false},
		{Target{Bucket: "other", Prefix: "fleet"}, false},
	} {
		if got := fleet.Contains(tc.o); got != tc.want {
			t.Errorf("%v contains %v = %v", fleet, tc.o, got)
		}
	}
	if !(Target{Bucket: "caps"}).Contains(Target{Bucket: "caps", Prefix: "x/y"}) {
		t.Error("a bucket's root contains every prefix in it")
	}
	if got := fleet.Key("/data/run/cap.strap"); got != "fleet/cap.strap" {
		t.Errorf("key %q", got)
	}
}

// FuzzParseErrorResponse: any body of a failed part upload (the server's, or anything
// between) gives an API error with a code, never a panic; an S3 error body's code and
// message come through as they are.
func FuzzParseErrorResponse(f *testing.F) {
	f.Add(403, []byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>SignatureDoesNotMatch</Code><Message>no</Message></Error>`))
	f.Add(400, []byte(`<Error><Code>BadDigest</Code><Message>The CRC32C you specified did not match the calculated checksum.</Message></Error>`))
	f.Add(404, []byte(``))
	f.Add(500, []byte(`<html>bad gateway</html>`))
	f.Add(503, []byte(`<Error><Code></Code></Error>`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		err := parseErrorResponse(status, fmt.Sprintf("%d x", status), body)
		var ae smithy.APIError
		if !errors.As(err, &ae) {
			t.Fatalf("not an API error: %v", err)
		}
		if ae.ErrorCode() == "" {
			t.Fatalf("no code for status %d", status)
		}
		var e s3ErrorBody
		if xml.Unmarshal(body, &e) == nil && e.Code != "" && (ae.ErrorCode() != e.Code || ae.ErrorMessage() != e.Message) {
			t.Fatalf("code %q message %q, the body says %q %q", ae.ErrorCode(), ae.ErrorMessage(), e.Code, e.Message)
		}
		_ = Describe(err)
	})
}

// TestWholeCRC: the object's CRC32C combined from its parts' equals the CRC32C of its bytes.
func TestWholeCRC(t *testing.T) {
	data := make([]byte, 3*MinPartSize/2+17)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	var parts []Part
	for off, n := 0, int32(1); off < len(data); n++ {
		size := min(len(data)-off, MinPartSize/2+int(n))
		parts = append(parts, Part{Number: n, Size: int64(size), CRC32C: crcB64(crc32.Checksum(data[off:off+size], castagnoli))})
		off += size
	}
	got, err := wholeCRC(parts)
	if err != nil || got != crcB64(crc32.Checksum(data, castagnoli)) || len(parts) < 3 {
		t.Fatalf("wholeCRC %s (%v), the bytes' %s", got, err, crcB64(crc32.Checksum(data, castagnoli)))
	}
}
