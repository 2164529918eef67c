package upload

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestSendfileOnlyOverPlainHTTP: over HTTPS the sendfile path declines without sending
// anything (the SDK's UploadPart sends the part).
func TestSendfileOnlyOverPlainHTTP(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "k")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	c, err := NewClient(context.Background(), ClientOptions{Endpoint: "https://127.0.0.1:1", Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, handled, err := c.uploadPartSendfile(context.Background(), "b", "k", "id", 1, f, 0, 100, crcB64(0))
	if handled || err != nil {
		t.Fatalf("https endpoint: handled %v, err %v; want declined", handled, err)
	}
}

// TestPartBodyStopsAtPartEnd: a part's body reads exactly its bytes, from its own offset,
// whatever else reads the file.
func TestPartBodyStopsAtPartEnd(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, err := newPartBody(f, 1000, 3000)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := newPartBody(f, 4000, 5000)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var ga, gb []byte
	buf := make([]byte, 777)
	for done := false; !done; {
		done = true
		if n, err := a.Read(buf); n > 0 || err == nil {
			ga, done = append(ga, buf[:n]...), false
		}
		if n, err := b.Read(buf); n > 0 || err == nil {
			gb, done = append(gb, buf[:n]...), false
		}
	}
	if string(ga) != string(data[1000:4000]) || string(gb) != string(data[4000:9000]) {
		t.Fatalf("part bodies read %d and %d bytes, not the parts' 3000 and 5000", len(ga), len(gb))
	}
}
