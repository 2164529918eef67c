package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
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
	f.Fuzz(func(t *testing.T, body []byte) {
		out, n, err := ResourceLines(resourcesMsg(string(body)))
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error without ErrBadMessage: %v", err)
			}
			return
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
