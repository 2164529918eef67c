package captureset

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/strap-llm/strap/internal/stream"
)

// Distributed is the stream header's client_metadata.distributed object (docs/DISTRIBUTED.md);
// a key the client did not write is nil.
type Distributed struct {
	Rank      *uint64 `json:"rank"`
	WorldSize *uint64 `json:"world_size"`
	LocalRank *uint64 `json:"local_rank"`
	Host      *string `json:"host"`
	TPRank    *uint64 `json:"tp_rank"`
	TPSize    *uint64 `json:"tp_size"`
	PPStage   *uint64 `json:"pp_stage"`
	PPSize    *uint64 `json:"pp_size"`
	DPRank    *uint64 `json:"dp_rank"`
	DPSize    *uint64 `json:"dp_size"`
	// Replicated says which rank stores replicated outputs ("tp_rank0"), when the client said.
	Replicated *string `json:"replicated"`
	// Modules is the client's decision per module (D2), when it recorded one.
	Modules map[string]struct {
		Kind string `json:"kind"`
		Axis *int   `json:"axis"`
	} `json:"modules"`
}

// Facts is what one rank's stream says of itself: the manifest's per-rank keys, read from
// the stream header and packet headers alone (no payload is read).
type Facts struct {
	// Session and StrapdHost are the header's "session" and "host".
	Session    uint64 `json:"session"`
	StrapdHost string `json:"strapd_host"`
	// Fingerprint is client_metadata.fingerprint, nil when absent.
	Fingerprint *string `json:"fingerprint"`
	// Distributed is client_metadata.distributed, nil for a single process.
	Distributed *Distributed `json:"distributed"`
	// Role is RoleOf(Distributed).
	Role     string    `json:"role"`
	Status   string    `json:"status"`
	Tokens   [2]uint64 `json:"tokens"`
	Forwards uint64    `json:"forwards"`
	Packets  uint64    `json:"packets"`
	Bytes    uint64    `json:"bytes"`
	// Modules are the TENSOR packets' names with the kind their records show: sharded
	// when they carry a shard descriptor (axis and full_shape of the first), replicated
	// when a "replica" meta or the header's distributed.modules says so, else local.
	Modules map[string]Module `json:"modules"`
	// Mixed names modules whose records disagree on their shard descriptor's presence or
	// axis (some sharded, some not).
	Mixed []string `json:"mixed,omitempty"`
	// Error is why the packet walk stopped before the end, empty when it did not.
	Error string `json:"error,omitempty"`
}

// header is the part of the stream header metadata the manifest repeats.
type header struct {
	Session *uint64 `json:"session"`
	Host    string  `json:"host"`
	Client  struct {
		Fingerprint *string      `json:"fingerprint"`
		Distributed *Distributed `json:"distributed"`
	} `json:"client_metadata"`
}

// recordMeta is the part of a TENSOR packet's meta that says how it was split (D2).
type recordMeta struct {
	Shard *struct {
		Axis      *int     `json:"axis"`
		FullShape []uint64 `json:"full_shape"`
	} `json:"shard"`
	Replica json.RawMessage `json:"replica"`
}

// RoleOf is a rank's role from its stream header's distributed object (D4): RoleReplica
// for a tp rank > 0 under replicated "tp_rank0" whose modules name at least one module and
// every one replicated; else RolePrimary. The Python client's capture_set.rank_role applies
// the same rule.
func RoleOf(d *Distributed) string {
	if d == nil || d.TPRank == nil || *d.TPRank == 0 || d.Replicated == nil || *d.Replicated != "tp_rank0" ||
		len(d.Modules) == 0 {
		return RolePrimary
	}
	for _, m := range d.Modules {
		if m.Kind != KindReplicated {
			return RolePrimary
		}
	}
	return RoleReplica
}

// ReadFacts walks the stream in r (packet headers only) for what the manifest says of it.
// The error is for a stream whose header cannot be read at all; a walk stopped by damage
// later is in Facts.Error with the counts up to it.
func ReadFacts(r io.ReaderAt, size int64) (*Facts, error) {
	rd, err := stream.NewReader(r, size)
	if err != nil {
		return nil, err
	}
	var h header
	if err := json.Unmarshal(rd.Header().MetaRaw, &h); err != nil {
		return nil, fmt.Errorf("stream header metadata: %w", err)
	}
	if h.Session == nil {
		return nil, fmt.Errorf("stream header metadata has no session")
	}
	f := &Facts{Session: *h.Session, StrapdHost: h.Host, Fingerprint: h.Client.Fingerprint,
		Distributed: h.Client.Distributed, Role: RoleOf(h.Client.Distributed), Status: StatusOpen,
		Bytes: uint64(size), Modules: map[string]Module{}}
	firstTok, endTok := uint64(0), uint64(0)
	anyTok, ended := false, false
	s := rd.Scan(true)
	for s.Next() {
		p := s.Packet()
		switch p.Type {
		case stream.TypeTensor, stream.TypeDrop, stream.TypeToken:
			if ended {
				continue
			}
			f.Packets++
			switch p.Type {
			case stream.TypeToken:
				if !anyTok || p.Step < firstTok {
					firstTok = p.Step
				}
				endTok = max(endTok, p.Step+1)
				anyTok = true
			case stream.TypeTensor:
				f.Forwards = max(f.Forwards, p.Forward+1)
				f.addRecord(p)
			}
		case stream.TypeEnd:
			if !ended {
				var em stream.EndMeta
				if json.Unmarshal(p.Meta, &em) == nil {
					f.Status = em.Status
				}
				ended = true
			}
		}
	}
	if err := s.Err(); err != nil {
		f.Error = err.Error()
	}
	if anyTok {
		f.Tokens = [2]uint64{firstTok, endTok}
	}
	if d := f.Distributed; d != nil {
		for name, m := range f.Modules {
			// "detect": the client decided by the first output (DISTRIBUTED.md D2); a
			// plain output (no shard descriptor) was then taken as whole: replicated.
			if dm, ok := d.Modules[name]; ok && m.Kind == KindLocal && (dm.Kind == KindReplicated || dm.Kind == kindDetect) {
				m.Kind = KindReplicated
				f.Modules[name] = m
			}
		}
	}
	return f, nil
}

func (f *Facts) addRecord(p *stream.PacketInfo) {
	var rm recordMeta
	if len(p.Meta) > 0 && (bytes.Contains(p.Meta, []byte(`"shard"`)) || bytes.Contains(p.Meta, []byte(`"replica"`))) {
		_ = json.Unmarshal(p.Meta, &rm) // meta the reader accepted is a JSON object
	}
	m := Module{Kind: KindLocal}
	switch {
	case rm.Shard != nil:
		m = Module{Kind: KindSharded, Axis: rm.Shard.Axis, FullShape: rm.Shard.FullShape}
	case len(rm.Replica) > 0 && !isNull(rm.Replica):
		m.Kind = KindReplicated
	}
	prev, seen := f.Modules[p.Name]
	if !seen {
		f.Modules[p.Name] = m
		return
	}
	if prev.Kind != m.Kind || !sameAxis(prev.Axis, m.Axis) {
		if !slices.Contains(f.Mixed, p.Name) {
			f.Mixed = append(f.Mixed, p.Name)
		}
	}
}

func sameAxis(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Compare checks a rank's manifest entry against its stream's facts: each key the manifest
// repeats from the stream, and the stream header's distributed object against the rank's
// place and the job's layout. Every disagreement names the rank and the key.
func Compare(m *Manifest, e *Rank, f *Facts) []Problem {
	var ps []Problem
	bad := func(key, format string, args ...any) {
		ps = append(ps, Problem{Rank: e.Rank, Key: key, Message: fmt.Sprintf(format, args...)})
	}
	if f.Session != e.Session {
		bad("session", "manifest %d, stream header %d", e.Session, f.Session)
	}
	if f.StrapdHost != e.StrapdHost {
		bad("strapd_host", "manifest %q, stream header %q", e.StrapdHost, f.StrapdHost)
	}
	if !sameStr(f.Fingerprint, e.Fingerprint) {
		bad("fingerprint", "manifest %s, stream header %s", strOrNull(e.Fingerprint), strOrNull(f.Fingerprint))
	}
	d := f.Distributed
	switch {
	case d == nil && m.WorldSize > 1:
		bad("rank", "the stream header has no client_metadata.distributed: not a rank of a job")
	case d == nil:
		// One process: its header says nothing of a layout, and there is one place.
	default:
		intKey := func(key string, got *uint64, want int) {
			if got == nil {
				bad(key, "the stream header's distributed object has no %s", key)
			} else if *got != uint64(want) {
				bad(key, "manifest %d, stream header %d", want, *got)
			}
		}
		// A client before the layout (D1) wrote rank and world size only: the place keys
		// are compared where the header has them.
		optKey := func(key string, got *uint64, want int) {
			if got != nil && *got != uint64(want) {
				bad(key, "manifest %d, stream header %d", want, *got)
			}
		}
		intKey("rank", d.Rank, e.Rank)
		intKey("world_size", d.WorldSize, m.WorldSize)
		optKey("tp_rank", d.TPRank, e.TPRank)
		optKey("pp_stage", d.PPStage, e.PPStage)
		optKey("dp_rank", d.DPRank, e.DPRank)
		optKey("layout.tp_size", d.TPSize, m.Layout.TPSize)
		optKey("layout.pp_size", d.PPSize, m.Layout.PPSize)
		optKey("layout.dp_size", d.DPSize, m.Layout.DPSize)
		switch {
		case d.LocalRank == nil && e.LocalRank != nil:
			bad("local_rank", "manifest %d, stream header null", *e.LocalRank)
		case d.LocalRank != nil && (e.LocalRank == nil || uint64(*e.LocalRank) != *d.LocalRank):
			bad("local_rank", "manifest %s, stream header %d", intOrNull(e.LocalRank), *d.LocalRank)
		}
		if d.Host != nil && *d.Host != e.Host {
			bad("host", "manifest %q, stream header %q", e.Host, *d.Host)
		}
	}
	// A manifest written before the role key has none: nothing to compare.
	if e.Role != "" && e.Role != f.Role {
		bad("role", "manifest %q, stream header %q", e.Role, f.Role)
	}
	if f.Role == RoleReplica && len(f.Modules) > 0 {
		bad("role", "the stream header makes it a replica, but the stream holds records of %d modules", len(f.Modules))
	}
	if f.Status != e.Status {
		bad("status", "manifest %q, stream %q", e.Status, f.Status)
	}
	if f.Packets != e.Packets {
		bad("packets", "manifest %d, stream %d", e.Packets, f.Packets)
	}
	if f.Tokens != e.Tokens {
		bad("tokens", "manifest [%d, %d), stream [%d, %d)", e.Tokens[0], e.Tokens[1], f.Tokens[0], f.Tokens[1])
	}
	if f.Forwards != e.Forwards {
		bad("forwards", "manifest %d, stream %d", e.Forwards, f.Forwards)
	}
	if f.Bytes != e.Bytes {
		bad("bytes", "manifest %d, stream %d", e.Bytes, f.Bytes)
	}
	for _, name := range f.Mixed {
		bad("modules."+name, "the stream's records of it disagree on their shard descriptor")
	}
	ps = append(ps, compareModules(e, f, d)...)
	return ps
}

func compareModules(e *Rank, f *Facts, d *Distributed) []Problem {
	var ps []Problem
	bad := func(name, format string, args ...any) {
		ps = append(ps, Problem{Rank: e.Rank, Key: "modules." + name, Message: fmt.Sprintf(format, args...)})
	}
	names := make([]string, 0, len(e.Modules)+len(f.Modules))
	for n := range e.Modules {
		names = append(names, n)
	}
	for n := range f.Modules {
		if _, ok := e.Modules[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		want, inManifest := e.Modules[n]
		got, inStream := f.Modules[n]
		switch {
		case !inStream:
			bad(n, "listed, but the stream has no record of it")
			continue
		case !inManifest:
			bad(n, "the stream has records of it, the manifest does not list it")
			continue
		}
		// The stream shows sharding by its records' descriptors; replicated and local
		// records look alike, so they are told apart only where the header's
		// distributed.modules or a "replica" meta says which.
		var declared string
		if d != nil {
			declared = d.Modules[n].Kind
		}
		switch {
		case got.Kind == KindSharded || want.Kind == KindSharded:
			if got.Kind != want.Kind {
				bad(n, "kind: manifest %q, stream records %q", want.Kind, got.Kind)
			} else if !sameAxis(got.Axis, want.Axis) {
				bad(n, "axis: manifest %s, stream records %s", intOrNull(want.Axis), intOrNull(got.Axis))
			} else if !slices.Equal(got.FullShape, want.FullShape) {
				bad(n, "full_shape: manifest %v, first stream record %v", want.FullShape, got.FullShape)
			}
		case got.Kind == KindReplicated && want.Kind != KindReplicated:
			bad(n, "kind: manifest %q, stream %q", want.Kind, got.Kind)
		case declared != "" && declared != kindDetect && declared != want.Kind:
			bad(n, "kind: manifest %q, stream header %q", want.Kind, declared)
		}
	}
	return ps
}

func sameStr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func strOrNull(s *string) string {
	if s == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *s)
}

func intOrNull(v *int) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}
