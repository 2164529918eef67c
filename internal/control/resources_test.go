package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/strap-llm/strap/internal/jsontext"
)

func resourcesMsg(body string) Message {
	return Message{Version: Version, Type: TypeResources, Body: []byte(body)}
}

func TestResourceLines(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		n                int
		bad              bool
	}{
		{name: "two events compacted", body: "{\"events\":[{\"event\":\"compute_execution\", \"flops\": 2,\n \"step\":0},{\"event\":\"kv_cache_update\"}]}",
			want: "{\"event\":\"compute_execution\",\"flops\":2,\"step\":0}\n{\"event\":\"kv_cache_update\"}\n", n: 2},
		{name: "string with escaped newline stays on one line", body: `{"events":[{"event":"x","s":"a\nb"}]}`,
			want: "{\"event\":\"x\",\"s\":\"a\\nb\"}\n", n: 1},
		{name: "missing events", body: `{}`, bad: true},
		{name: "null events", body: `{"events":null}`, bad: true},
		{name: "empty events", body: `{"events":[]}`, bad: true},
		{name: "event not an object", body: `{"events":[1]}`, bad: true},
		{name: "event without a name", body: `{"events":[{"x":1}]}`, bad: true},
		{name: "event name not a string", body: `{"events":[{"event":3}]}`, bad: true},
		{name: "empty event name", body: `{"events":[{"event":""}]}`, bad: true},
		{name: "events not a list", body: `{"events":{"event":"x"}}`, bad: true},
		{name: "body not an object", body: `[{"event":"x"}]`, bad: true},
		{name: "keys match exactly", body: `{"Events":[{"event":"x"}]}`, bad: true},
		{name: "event key matches exactly", body: `{"events":[{"Event":"x"}]}`, bad: true},
		{name: "escaped keys are unescaped", body: `{"ev\u0065nts":[{"\u0065vent":"x","n":{"event":""}}]}`,
			want: "{\"\\u0065vent\":\"x\",\"n\":{\"event\":\"\"}}\n", n: 1},
		{name: "last of a repeated key counts", body: `{"events":[{"event":"","event":"y"}],"x":[1,"]"]}`,
			want: "{\"event\":\"\",\"event\":\"y\"}\n", n: 1},
		{name: "repeated key ending empty", body: `{"events":[{"event":"y","event":""}]}`, bad: true},
		{name: "invalid JSON", body: `{"events":[{"event":"x"}]`, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n, err := ResourceLines(resourcesMsg(tc.body))
			if tc.bad {
				if !errors.Is(err, ErrBadMessage) {
					t.Fatalf("want ErrBadMessage, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want || n != tc.n {
				t.Fatalf("got %q (%d), want %q (%d)", got, n, tc.want, tc.n)
			}
		})
	}
}

func FuzzResourceLines(f *testing.F) {
	f.Add([]byte(`{"events":[{"event":"compute_execution","flops":65536,"duration_us":1.5}]}`))
	f.Add([]byte(`{"events":[{"event":"a"},{"event":"b","x":[1,2,{"y":null}]}]}`))
	f.Add([]byte(`{"events":[{"event":"x","s":"line\nbreak"}]}`))
	f.Add([]byte(`{"events":[]}`))
	f.Add([]byte(`{"events":[{"event":1}]}`))
	f.Add([]byte(`{"Events":[{"Event":"x"}], "events" : [ {"\u0065vent" : "a\"]}" , "e":[{}]} ]}`))
	f.Add([]byte(`{"events":[{"event":"y","event":""}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, n, err := ResourceLines(resourcesMsg(string(body)))
		want, wantErr := referenceLines(body)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("ResourceLines error %v, decoding with encoding/json: %v", err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error without ErrBadMessage: %v", err)
			}
			return
		}
		if string(out) != string(want) {
			t.Fatalf("lines %q, decoding with encoding/json gives %q", out, want)
		}
		lines := bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
		if len(lines) != n || n == 0 || !bytes.HasSuffix(out, []byte("\n")) {
			t.Fatalf("%d lines for %d events: %q", len(lines), n, out)
		}
		for _, l := range lines {
			var ev map[string]any
			if err := json.Unmarshal(l, &ev); err != nil {
				t.Fatalf("line %q is not a JSON object: %v", l, err)
			}
			if s, ok := ev["event"].(string); !ok || s == "" {
				t.Fatalf("line %q has no event name", l)
			}
		}
	})
}

// BenchmarkResourceLines is the daemon's cost per RESOURCES message: a full 64 KiB body
// of mul_mat events as the Python client packs them.
func BenchmarkResourceLines(b *testing.B) {
	ev := `{"event":"compute_execution","resource_id":"cpu_compute_layer_0_q_proj_1795669194535979_1","timestamp":1795669194535979,` +
		`"session_id":"resource_sess_20261126_045954_528676_9787","step":0,"forward":0,"layer_id":0,"component_type":"attention",` +
		`"module":"model.layers.0.self_attn.q_proj","operation":"mul_mat","input_tensors":[{"name":"input","shape":[2,40,256],"dtype":"float32"},` +
		`{"name":"weight","shape":[256,256],"dtype":"float32"}],"output_shape":[2,40,256],"flops":10485760,"compute_intensity_gflops":0.01048576,` +
		`"flops_source":"computed_from_shapes","bytes_accessed":425984,"duration_us":600.0,"duration_source":"perf_counter",` +
		`"throughput_gflops_per_s":17.476266666666668,"memory_throughput_gbps":0.7099733333333333}`
	var body bytes.Buffer
	body.WriteString(`{"events":[`)
	n := 0
	for body.Len()+len(ev)+3 < 65536-12 {
		if n > 0 {
			body.WriteByte(',')
		}
		body.WriteString(ev)
		n++
	}
	body.WriteString(`]}`)
	m := resourcesMsg(body.String())
	b.ReportAllocs()
	b.SetBytes(int64(body.Len()))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, got, err := ResourceLines(m)
		if err != nil || got != n || len(out) != n*(len(ev)+1) {
			b.Fatalf("%d events, %d bytes, %v", got, len(out), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}

// referenceLines is ResourceLines written with encoding/json decoding (maps: exact keys, the
// last of a repeated key), the oracle the fuzz test holds the faster walk to.
func referenceLines(body []byte) ([]byte, error) {
	if err := jsontext.Check(body); err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, err
	}
	var evs []json.RawMessage
	if err := json.Unmarshal(top["events"], &evs); err != nil || len(evs) == 0 {
		return nil, errors.New("no events")
	}
	var out bytes.Buffer
	for _, ev := range evs {
		var m map[string]any
		if err := json.Unmarshal(ev, &m); err != nil || m == nil {
			return nil, errors.New("not an object")
		}
		if s, ok := m["event"].(string); !ok || s == "" {
			return nil, errors.New("no event name")
		}
		if err := json.Compact(&out, ev); err != nil {
			return nil, err
		}
		out.WriteByte('\n')
	}
	return out.Bytes(), nil
}
