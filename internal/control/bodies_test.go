package control

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// clientBodies are the Go structs that read each body the client sends, by type name.
var clientBodies = map[string]any{
	TypeHello.String():      Hello{},
	TypeOpen.String():       Open{},
	TypePublish.String():    Publish{},
	TypeDrop.String():       Drop{},
	TypeToken.String():      Token{},
	TypeCheckpoint.String(): Checkpoint{},
	TypeClose.String():      Close{},
	TypeStatus.String():     struct{}{},
	TypeResources.String():  Resources{},
}

// jsonFields are the JSON names a struct's fields decode from.
func jsonFields(v any) []string {
	var out []string
	t := reflect.TypeOf(v)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// unreadFields lists "TYPE.field" for every field in bodies that no Go body struct reads,
// and "TYPE" for a type that has no Go body struct at all.
func unreadFields(bodies map[string][]string) []string {
	var out []string
	for typ, fields := range bodies {
		v, ok := clientBodies[typ]
		if !ok {
			out = append(out, typ)
			continue
		}
		known := jsonFields(v)
		for _, f := range fields {
			if !slices.Contains(known, f) {
				out = append(out, typ+"."+f)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestClientBodiesRead: every field the Python client sends (testdata/protocol/
// client_bodies.json, generated from its message definitions) is read by the Go body
// struct, so nothing the client says is dropped without a word.
func TestClientBodiesRead(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(goldenDir, "client_bodies.json"))
	if err != nil {
		t.Fatal(err)
	}
	var bodies map[string][]string
	if err := json.Unmarshal(b, &bodies); err != nil {
		t.Fatalf("client_bodies.json: %v", err)
	}
	if len(bodies) == 0 {
		t.Fatal("client_bodies.json lists no message type")
	}
	for typ, fields := range bodies {
		if !slices.IsSorted(fields) {
			t.Errorf("%s: fields %v are not sorted", typ, fields)
		}
	}
	if unread := unreadFields(bodies); len(unread) > 0 {
		t.Fatalf("the client sends fields the daemon does not read: %v", unread)
	}
}

// TestUnreadFields shows the check above can fail: a misspelt field or an unknown type is
// reported, a known one is not.
func TestUnreadFields(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bodies map[string][]string
		want   []string
	}{
		{"all read", map[string][]string{"OPEN": {"memory_hint", "ring_size"}, "STATUS": {}}, nil},
		{"unknown field", map[string][]string{"OPEN": {"ring_size", "ring_sise"}}, []string{"OPEN.ring_sise"}},
		{"field of another body", map[string][]string{"PUBLISH": {"head", "tail"}}, []string{"PUBLISH.tail"}},
		{"status takes no field", map[string][]string{"STATUS": {"verbose"}}, []string{"STATUS.verbose"}},
		{"unknown type", map[string][]string{"HELO": {"protocol"}}, []string{"HELO"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unreadFields(tc.bodies); !slices.Equal(got, tc.want) {
				t.Fatalf("unreadFields = %v, want %v", got, tc.want)
			}
		})
	}
}
