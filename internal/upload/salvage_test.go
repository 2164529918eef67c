package upload_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/strap-llm/strap/internal/upload"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

const mp = upload.MinPartSize

func TestSalvageRun(t *testing.T) {
	p := func(n int32, size int64) upload.Part { return upload.Part{Number: n, Size: size} }
	for _, tc := range []struct {
		name    string
		parts   []upload.Part
		run     int
		missing int32
	}{
		{"none", nil, 0, 0},
		{"no part 1", []upload.Part{p(2, mp), p(3, mp)}, 0, 1},
		{"contiguous", []upload.Part{p(1, mp), p(2, mp), p(3, mp)}, 3, 0},
		{"gap", []upload.Part{p(1, mp), p(2, mp), p(4, mp), p(5, mp)}, 2, 3},
		{"short tail ends it", []upload.Part{p(1, 2*mp), p(2, mp+1), p(3, 2*mp)}, 2, 0},
		{"below the minimum ends it", []upload.Part{p(1, 100), p(2, mp)}, 1, 0},
		{"doubling sizes go on", []upload.Part{p(1, mp), p(2, 2*mp), p(3, 2*mp-7)}, 3, 0},
		{"empty part ends it", []upload.Part{p(1, mp), p(2, 0), p(3, mp)}, 1, 0},
	} {
		run, missing := upload.SalvageRun(tc.parts)
		if len(run) != tc.run || missing != tc.missing {
			t.Errorf("%s: run %d parts, missing %d; want %d, %d", tc.name, len(run), missing, tc.run, tc.missing)
		}
		for i, r := range run {
			if r.Number != int32(i+1) {
				t.Errorf("%s: run[%d] is part %d", tc.name, i, r.Number)
			}
		}
	}
}

// openUpload leaves an open upload of key in bucket caps with the given parts of data
// (uploadtest.OpenUpload, parts of mp bytes); it returns the upload id.
func openUpload(t *testing.T, c *upload.Client, key string, data []byte, parts ...int32) string {
	t.Helper()
	return uploadtest.OpenUpload(t, c, "caps", key, data, mp, parts...)
}

// openIDs are the ids of the open uploads of key.
func openIDs(t *testing.T, c *upload.Client, key string) []string {
	t.Helper()
	ups, err := c.ListOpenUploads(context.Background(), "caps", key, true)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, u := range ups {
		ids = append(ids, u.UploadID)
	}
	slices.Sort(ids)
	return ids
}

func objectExists(t *testing.T, c *upload.Client, key string) bool {
	_, err := c.S3().HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("caps"), Key: aws.String(key)})
	return err == nil
}

// TestSalvage against VersityGW: the refusals leave the bucket as it was; the chosen upload
// is completed from parts 1..2 (part 3 missing, part 4 left out) into the stream's prefix.
func TestSalvage(t *testing.T) {
	srv := uploadtest.Start(t)
	c := srv.Client(t)
	srv.Bucket(t, c, "caps")
	ctx := context.Background()
	data := randomBytes(4*mp+1000, 5)
	key := "run/h/s.strap"
	id1 := openUpload(t, c, key, data, 1, 2, 4)

	ups, err := c.ListOpenUploads(ctx, "caps", "run", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(ups) != 1 || ups[0].Key != key || ups[0].Parts != 3 || ups[0].Bytes != 3*mp || ups[0].RunParts != 2 ||
		ups[0].RunBytes != 2*mp || ups[0].Missing != 3 || time.Since(ups[0].Initiated) > time.Hour {
		t.Fatalf("open uploads %+v", ups)
	}

	// No acknowledgement: refused, naming what it would do; nothing changed.
	_, err = c.Salvage(ctx, "caps", key, upload.SalvageOptions{})
	if !errors.Is(err, upload.ErrNotAcknowledged) || !strings.Contains(err.Error(), "parts 1..2 (10485760 bytes)") {
		t.Fatalf("without the acknowledgement: %v", err)
	}
	// Several uploads of the key: refused, listing them.
	id2 := openUpload(t, c, key, data, 1)
	_, err = c.Salvage(ctx, "caps", key, upload.SalvageOptions{HostIsGone: true})
	if !errors.Is(err, upload.ErrSeveralUploads) || !strings.Contains(err.Error(), id1) || !strings.Contains(err.Error(), id2) {
		t.Fatalf("several uploads: %v", err)
	}
	// No upload of another key (the key is matched exactly, not as a prefix).
	_, err = c.Salvage(ctx, "caps", "run/h/s", upload.SalvageOptions{HostIsGone: true})
	if !errors.Is(err, upload.ErrNoOpenUpload) {
		t.Fatalf("another key: %v", err)
	}
	_, err = c.Salvage(ctx, "caps", key, upload.SalvageOptions{HostIsGone: true, UploadID: "nosuch"})
	if !errors.Is(err, upload.ErrNoOpenUpload) {
		t.Fatalf("an unknown upload id: %v", err)
	}
	want := []string{id1, id2}
	slices.Sort(want)
	if got := openIDs(t, c, key); !slices.Equal(got, want) || objectExists(t, c, key) {
		t.Fatalf("a refusal changed the bucket: uploads %v, object %v", got, objectExists(t, c, key))
	}

	res, err := c.Salvage(ctx, "caps", key, upload.SalvageOptions{HostIsGone: true, UploadID: id1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Parts != 2 || res.Bytes != 2*mp || res.LeftParts != 1 || res.LeftBytes != mp || res.UploadID != id1 || res.Verified == "" {
		t.Fatalf("salvaged %+v", res)
	}
	if got := uploadtest.Object(t, c, "caps", key); !bytes.Equal(got, data[:2*mp]) {
		t.Fatalf("object of %d bytes is not the stream's first %d", len(got), 2*mp)
	}
	t.Logf("salvaged: %+v", res)

	// The object is there now: never replaced, the other upload left open.
	_, err = c.Salvage(ctx, "caps", key, upload.SalvageOptions{HostIsGone: true, UploadID: id2})
	if !errors.Is(err, upload.ErrObjectExists) {
		t.Fatalf("over the object: %v", err)
	}
	if got := openIDs(t, c, key); !slices.Equal(got, []string{id2}) {
		t.Fatalf("open uploads after: %v", got)
	}
	if got := uploadtest.Object(t, c, "caps", key); !bytes.Equal(got, data[:2*mp]) {
		t.Fatal("the object changed")
	}

	// An upload without part 1 holds no prefix of the stream: nothing is completed.
	openUpload(t, c, "run/h/t.strap", data, 2, 3)
	_, err = c.Salvage(ctx, "caps", "run/h/t.strap", upload.SalvageOptions{HostIsGone: true})
	if !errors.Is(err, upload.ErrNothingToSalvage) || objectExists(t, c, "run/h/t.strap") {
		t.Fatalf("without part 1: %v", err)
	}
}

// TestSalvagedWhileStillRunning: the host was not gone after all. Its strapd's next part is
// refused (NoSuchUpload), it starts a new multipart upload from the first part, and at the
// end replaces the salvaged prefix with the whole stream (docs/OBJECT_STORAGE.md).
func TestSalvagedWhileStillRunning(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, true)
	w, u := f.begin(t, m, "alive.strap", 0)
	data := randomBytes(4*mp+4321, 13)
	if _, err := w.Write(data[:2*mp+10]); err != nil {
		t.Fatal(err)
	}
	u.Durable(2*mp + 10)
	waitUploaded(t, u, 2*mp)
	res, err := f.client.Salvage(context.Background(), "caps", "run/a/alive.strap", upload.SalvageOptions{HostIsGone: true})
	if err != nil || res.Bytes != 2*mp {
		t.Fatalf("salvage: %+v, %v", res, err)
	}
	if _, err := w.Write(data[2*mp+10:]); err != nil {
		t.Fatal(err)
	}
	u.Durable(int64(len(data)))
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, u, 60*time.Second); st.State != upload.StateComplete {
		t.Fatalf("%+v", st)
	}
	if got := uploadtest.Object(t, f.client, "caps", "run/a/alive.strap"); !bytes.Equal(got, data) {
		t.Fatalf("object of %d bytes is not the whole stream (%d)", len(got), len(data))
	}
}

// FuzzSalvageRun: whatever part list a server answers (numbers and sizes as it likes),
// the run is parts 1..k in order, each but the last at least the minimum part size and
// none but the last smaller than the one before it, and missing names a part absent.
func FuzzSalvageRun(f *testing.F) {
	f.Add([]byte{1, 5, 2, 5, 4, 5})
	f.Add([]byte{1, 10, 2, 6, 3, 10})
	f.Add([]byte{2, 5})
	f.Fuzz(func(t *testing.T, b []byte) {
		var parts []upload.Part
		for i := 0; i+1 < len(b); i += 2 {
			parts = append(parts, upload.Part{Number: int32(b[i]), Size: int64(b[i+1]) << 20})
		}
		slices.SortStableFunc(parts, func(x, y upload.Part) int { return int(x.Number - y.Number) })
		run, missing := upload.SalvageRun(parts)
		for i, p := range run {
			if p.Number != int32(i+1) || p.Size <= 0 {
				t.Fatalf("run[%d] = %+v", i, p)
			}
			if last := i == len(run)-1; !last && (p.Size < mp || i > 0 && p.Size < run[i-1].Size) {
				t.Fatalf("part %d of %d bytes, not the last, after %+v", p.Number, p.Size, run[max(i-1, 0)])
			}
		}
		if missing != 0 {
			if missing != int32(len(run)+1) {
				t.Fatalf("missing %d after a run of %d", missing, len(run))
			}
			for _, p := range parts {
				if p.Number == missing {
					t.Fatalf("part %d named missing is there", missing)
				}
			}
		}
	})
}
