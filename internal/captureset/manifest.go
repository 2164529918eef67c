package captureset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/strap-llm/strap/internal/jsontext"
)

// The manifest's identity and size limit (docs/DISTRIBUTED.md D4).
const (
	// Format is the value of the manifest's "format" key.
	Format = "strap-capture-set"
	// Version is the manifest version this package reads.
	Version = 1
	// MaxSize is the largest manifest read: a bigger file is refused before it is parsed.
	MaxSize = 64 << 20
)

// Module kinds (docs/DISTRIBUTED.md D2).
const (
	KindLocal      = "local"
	KindReplicated = "replicated"
	KindSharded    = "sharded"
	// kindDetect is what a stream header's distributed.modules says of a module the client
	// decided by its first output; never a manifest kind.
	kindDetect = "detect"
)

// StatusOpen is a rank's status when its stream has no END packet.
const StatusOpen = "open"

// A rank's role (docs/DISTRIBUTED.md D4): RoleReplica stores nothing by design (every module
// it captures is replicated and tp rank 0 of its group stores it: a vLLM engine's tp ranks
// > 0); every other rank is RolePrimary. RoleOf says which from a stream header.
const (
	RolePrimary = "primary"
	RoleReplica = "replica"
)

// Errors of this package.
var (
	// ErrNotManifest: the bytes are not a JSON object whose "format" is Format.
	ErrNotManifest = errors.New("not a capture-set manifest")
	// ErrTooLarge: the manifest is over MaxSize bytes.
	ErrTooLarge = errors.New("capture-set manifest over 64 MiB")
)

// maxListed caps the problems one check lists; what is past it is counted in one line.
const maxListed = 200

// Problem is one thing wrong with a manifest or with a rank's stream against it.
type Problem struct {
	// Rank is the rank the problem is about; -1 for the manifest as a whole.
	Rank int `json:"rank"`
	// Key is the manifest key (or stream part) at fault.
	Key string `json:"key"`
	// Message says what is wrong.
	Message string `json:"message"`
}

func (p Problem) String() string {
	if p.Rank < 0 {
		return p.Key + ": " + p.Message
	}
	return fmt.Sprintf("rank %d: %s: %s", p.Rank, p.Key, p.Message)
}

// InvalidError lists what is wrong with a manifest that Parse refused.
type InvalidError struct {
	Problems []Problem
}

func (e *InvalidError) Error() string {
	s := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		s[i] = p.String()
	}
	return "invalid capture-set manifest: " + strings.Join(s, "; ")
}

// Layout is the job's parallel layout: tp_size·pp_size·dp_size = world_size.
type Layout struct {
	TPSize int `json:"tp_size"`
	PPSize int `json:"pp_size"`
	DPSize int `json:"dp_size"`
}

// Module is what a rank holds of one module name.
type Module struct {
	// Kind is KindLocal, KindReplicated or KindSharded.
	Kind string `json:"kind"`
	// Axis and FullShape are set only for a sharded module: the axis its pieces split
	// and the stitched tensor's shape (of its first record).
	Axis      *int     `json:"axis,omitempty"`
	FullShape []uint64 `json:"full_shape,omitempty"`
}

// Rank is one rank's entry of the manifest.
type Rank struct {
	Rank int `json:"rank"`
	// LocalRank is nil when the launcher did not say.
	LocalRank *int   `json:"local_rank"`
	Host      string `json:"host"`
	TPRank    int    `json:"tp_rank"`
	PPStage   int    `json:"pp_stage"`
	DPRank    int    `json:"dp_rank"`
	// Role is RolePrimary or RoleReplica; empty in a manifest written before the key.
	Role string `json:"role,omitempty"`
	// Stream is the stream as written: relative to the manifest's directory, absolute, or
	// an s3:// URL (Locate resolves it).
	Stream     string `json:"stream"`
	Session    uint64 `json:"session"`
	StrapdHost string `json:"strapd_host"`
	// Fingerprint is nil when the stream header has none.
	Fingerprint *string `json:"fingerprint"`
	// Status is the END packet's status or StatusOpen.
	Status string `json:"status"`
	// Tokens is [first, end) of the TOKEN packets' indices.
	Tokens   [2]uint64         `json:"tokens"`
	Forwards uint64            `json:"forwards"`
	Packets  uint64            `json:"packets"`
	Bytes    uint64            `json:"bytes"`
	Modules  map[string]Module `json:"modules"`
}

// Manifest is a parsed and checked capture-set manifest.
type Manifest struct {
	Format    string `json:"format"`
	Version   int    `json:"version"`
	Created   string `json:"created"`
	JobID     string `json:"job_id"`
	WorldSize int    `json:"world_size"`
	Layout    Layout `json:"layout"`
	// Ranks has one entry per rank, in rank order.
	Ranks []Rank `json:"ranks"`
}

// Sniff reports whether b is meant as a capture-set manifest: a JSON object whose "format"
// key is Format. It does not check the rest (Parse does).
func Sniff(b []byte) bool {
	var head struct {
		Format json.RawMessage `json:"format"`
	}
	if json.Unmarshal(b, &head) != nil {
		return false
	}
	var f string
	return json.Unmarshal(head.Format, &f) == nil && f == Format
}

// Parse reads a manifest and checks it as D4 says: the format and version, every key's
// type, one entry per rank 0 … world_size-1 in rank order, the layout's sizes multiplying
// to world_size and the ranks' places filling it exactly once, token ranges, module kinds
// and stream locations. Unknown keys are ignored. Every problem found is listed in an
// *InvalidError, each naming the rank and the key.
func Parse(b []byte) (*Manifest, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%d bytes: %w", len(b), ErrTooLarge)
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%w: not valid JSON", ErrNotManifest)
	}
	if err := jsontext.Check(b); err != nil {
		return nil, &InvalidError{[]Problem{{Rank: -1, Key: "text", Message: err.Error()}}}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil || top == nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrNotManifest)
	}
	ps := &problems{}
	f := fields{m: top, rank: -1, ps: ps}
	m := &Manifest{}
	if m.Format = f.str("format"); m.Format != Format {
		return nil, fmt.Errorf("%w: format %q, expected %q", ErrNotManifest, m.Format, Format)
	}
	if v, ok := f.uint("version"); ok {
		if v != Version {
			return nil, &InvalidError{[]Problem{{Rank: -1, Key: "version", Message: fmt.Sprintf("%d, this strapd reads version %d", v, Version)}}}
		}
		m.Version = Version
	}
	if m.Created = f.str("created"); m.Created != "" {
		if _, err := time.Parse(time.RFC3339Nano, m.Created); err != nil {
			f.bad("created", "%q is not an RFC 3339 time", m.Created)
		}
	}
	if m.JobID = f.str("job_id"); f.has("job_id") && m.JobID == "" {
		f.bad("job_id", "empty")
	}
	ws, wsOK := f.uint("world_size")
	if wsOK && ws == 0 {
		f.bad("world_size", "0: a job has at least one rank")
		wsOK = false
	}
	m.Layout = parseLayout(f, ws, wsOK)
	var entries []json.RawMessage
	if raw, ok := f.raw("ranks", false); ok {
		if err := json.Unmarshal(raw, &entries); err != nil {
			f.bad("ranks", "not a list")
		}
	}
	if wsOK {
		if ws != uint64(len(entries)) {
			f.bad("ranks", "%d entries for world_size %d", len(entries), ws)
		}
		if ws <= uint64(len(entries)) {
			m.WorldSize = int(ws)
		}
	}
	m.Ranks = parseRanks(entries, m, ws, wsOK, ps)
	if len(ps.list) > 0 {
		return nil, &InvalidError{ps.done()}
	}
	return m, nil
}

func parseLayout(f fields, ws uint64, wsOK bool) Layout {
	raw, ok := f.raw("layout", false)
	if !ok {
		return Layout{}
	}
	var lm map[string]json.RawMessage
	if json.Unmarshal(raw, &lm) != nil || lm == nil {
		f.bad("layout", "not an object")
		return Layout{}
	}
	lf := fields{m: lm, rank: -1, ps: f.ps, prefix: "layout."}
	tp, ok1 := lf.uint("tp_size")
	pp, ok2 := lf.uint("pp_size")
	dp, ok3 := lf.uint("dp_size")
	if !ok1 || !ok2 || !ok3 {
		return Layout{}
	}
	if tp == 0 || pp == 0 || dp == 0 {
		f.bad("layout", "tp_size %d, pp_size %d, dp_size %d: each is at least 1", tp, pp, dp)
		return Layout{}
	}
	if !wsOK {
		return Layout{}
	}
	// Each size is at most world_size, so the product cannot overflow before it is compared.
	if tp > ws || pp > ws || dp > ws || tp*pp > ws || tp*pp*dp != ws {
		f.bad("layout", "tp_size %d · pp_size %d · dp_size %d is not world_size %d", tp, pp, dp, ws)
		return Layout{}
	}
	return Layout{TPSize: int(tp), PPSize: int(pp), DPSize: int(dp)}
}

// parseRanks checks each entry, then that the entries are the ranks 0 … world_size-1,
// once each, in order, and fill the layout's places once each.
func parseRanks(entries []json.RawMessage, m *Manifest, ws uint64, wsOK bool, ps *problems) []Rank {
	out := make([]Rank, 0, len(entries))
	at := map[int]int{} // rank → entry index
	type place struct{ tp, pp, dp int }
	places := map[place]int{}
	lay := m.Layout
	for i, raw := range entries {
		var em map[string]json.RawMessage
		if json.Unmarshal(raw, &em) != nil || em == nil {
			ps.add(-1, fmt.Sprintf("ranks[%d]", i), "not an object")
			continue
		}
		f := fields{m: em, rank: -1, ps: ps, prefix: fmt.Sprintf("ranks[%d].", i)}
		r, ok := f.uint("rank")
		if !ok {
			continue
		}
		if wsOK && r >= ws {
			ps.add(-1, fmt.Sprintf("ranks[%d].rank", i), fmt.Sprintf("%d is outside a world of %d", r, ws))
			continue
		}
		if !wsOK && r >= uint64(len(entries)) {
			ps.add(-1, fmt.Sprintf("ranks[%d].rank", i), fmt.Sprintf("%d with only %d entries", r, len(entries)))
			continue
		}
		rank := int(r)
		if j, dup := at[rank]; dup {
			ps.add(rank, "rank", fmt.Sprintf("listed twice (ranks[%d] and ranks[%d])", j, i))
			continue
		}
		at[rank] = i
		if rank != i {
			ps.add(rank, "rank", fmt.Sprintf("at ranks[%d]: the list is not in rank order", i))
		}
		f = fields{m: em, rank: rank, ps: ps}
		e := parseRank(f, rank)
		if lay.TPSize > 0 {
			tpOK := f.below("tp_rank", e.TPRank, lay.TPSize, "tp_size")
			ppOK := f.below("pp_stage", e.PPStage, lay.PPSize, "pp_size")
			dpOK := f.below("dp_rank", e.DPRank, lay.DPSize, "dp_size")
			if tpOK && ppOK && dpOK {
				pl := place{e.TPRank, e.PPStage, e.DPRank}
				if other, taken := places[pl]; taken {
					f.bad("tp_rank/pp_stage/dp_rank", "place (tp_rank %d, pp_stage %d, dp_rank %d) is rank %d's too",
						pl.tp, pl.pp, pl.dp, other)
				} else {
					places[pl] = rank
				}
			}
		}
		out = append(out, e)
	}
	if wsOK {
		// Every entry kept is a rank below world_size, so the count of missing ones is exact;
		// the first few are named (a huge world_size must not be walked).
		missing := ws - uint64(len(at))
		named := 0
		for r := 0; uint64(r) < ws && named < 10 && uint64(named) < missing; r++ {
			if _, ok := at[r]; !ok {
				ps.add(r, "ranks", "no entry for this rank")
				named++
			}
		}
		if missing > uint64(named) {
			ps.add(-1, "ranks", fmt.Sprintf("%d more ranks have no entry", missing-uint64(named)))
		}
	}
	return out
}

func parseRank(f fields, rank int) Rank {
	e := Rank{Rank: rank}
	if lr, ok := f.optUint("local_rank"); ok && lr != nil {
		if *lr >= 1<<31 {
			f.bad("local_rank", "%d is not a rank on one host", *lr)
		} else {
			v := int(*lr)
			e.LocalRank = &v
		}
	}
	e.Host = f.str("host")
	e.TPRank = f.smallInt("tp_rank")
	e.PPStage = f.smallInt("pp_stage")
	e.DPRank = f.smallInt("dp_rank")
	if f.has("role") {
		switch e.Role = f.str("role"); e.Role {
		case RolePrimary, RoleReplica:
		default:
			f.bad("role", "%q, expected primary or replica", e.Role)
		}
	}
	if e.Stream = f.str("stream"); f.has("stream") {
		if err := checkLocation(e.Stream); err != nil {
			f.bad("stream", "%v", err)
		}
	}
	e.Session, _ = f.uint("session")
	e.StrapdHost = f.str("strapd_host")
	if raw, ok := f.raw("fingerprint", true); ok && !isNull(raw) {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			f.bad("fingerprint", "not a string or null")
		} else {
			e.Fingerprint = &s
		}
	}
	switch e.Status = f.str("status"); e.Status {
	case "complete", "aborted", "error", StatusOpen:
	default:
		if f.has("status") {
			f.bad("status", "%q, expected complete, aborted, error or open", e.Status)
		}
	}
	if raw, ok := f.raw("tokens", false); ok {
		var tk []json.RawMessage
		if json.Unmarshal(raw, &tk) != nil || len(tk) != 2 {
			f.bad("tokens", "not a list [first, end]")
		} else {
			a, okA := parseUint(tk[0])
			b, okB := parseUint(tk[1])
			switch {
			case !okA || !okB:
				f.bad("tokens", "[%s, %s]: not non-negative integers", tk[0], tk[1])
			case a > b:
				f.bad("tokens", "[%d, %d]: first after end", a, b)
			default:
				e.Tokens = [2]uint64{a, b}
			}
		}
	}
	e.Forwards, _ = f.uint("forwards")
	e.Packets, _ = f.uint("packets")
	e.Bytes, _ = f.uint("bytes")
	if e.Tokens[1]-e.Tokens[0] > e.Packets {
		f.bad("tokens", "[%d, %d] holds more tokens than the %d packets", e.Tokens[0], e.Tokens[1], e.Packets)
	}
	e.Modules = parseModules(f)
	if e.Role == RoleReplica && len(e.Modules) > 0 {
		f.bad("role", "replica, but modules names %d (a replica stores no record)", len(e.Modules))
	}
	return e
}

func parseModules(f fields) map[string]Module {
	raw, ok := f.raw("modules", false)
	if !ok {
		return nil
	}
	var mm map[string]json.RawMessage
	if json.Unmarshal(raw, &mm) != nil || mm == nil {
		f.bad("modules", "not an object")
		return nil
	}
	out := make(map[string]Module, len(mm))
	for name, raw := range mm {
		var obj map[string]json.RawMessage
		key := "modules." + name
		if json.Unmarshal(raw, &obj) != nil || obj == nil {
			f.bad(key, "not an object")
			continue
		}
		mf := fields{m: obj, rank: f.rank, ps: f.ps, prefix: key + "."}
		mod := Module{Kind: mf.str("kind")}
		axisRaw, hasAxis := obj["axis"]
		shapeRaw, hasShape := obj["full_shape"]
		hasAxis = hasAxis && !isNull(axisRaw)
		hasShape = hasShape && !isNull(shapeRaw)
		switch mod.Kind {
		case KindLocal, KindReplicated:
			if hasAxis || hasShape {
				f.bad(key, "kind %q with axis or full_shape (only a sharded module has them)", mod.Kind)
			}
		case KindSharded:
			a, okA := mf.uint("axis")
			var shape []json.RawMessage
			if !hasShape || json.Unmarshal(shapeRaw, &shape) != nil || len(shape) == 0 {
				f.bad(key+".full_shape", "not a non-empty list")
				break
			}
			mod.FullShape = make([]uint64, len(shape))
			for i, d := range shape {
				v, ok := parseUint(d)
				if !ok {
					f.bad(key+".full_shape", "dimension %d is %s, not a non-negative integer", i, d)
				}
				mod.FullShape[i] = v
			}
			if okA {
				if a >= uint64(len(shape)) {
					f.bad(key+".axis", "%d outside a %d-dimensional full_shape", a, len(shape))
				} else {
					ax := int(a)
					mod.Axis = &ax
				}
			}
		default:
			if mf.has("kind") {
				f.bad(key+".kind", "%q, expected local, replicated or sharded", mod.Kind)
			}
		}
		out[name] = mod
	}
	return out
}

// checkLocation refuses what Locate cannot resolve: an empty location or a URL other than s3://.
func checkLocation(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if i := strings.Index(s, "://"); i >= 0 && !strings.HasPrefix(s, "s3://") {
		return fmt.Errorf("%q: only paths and s3:// URLs are read", s)
	}
	return nil
}

// ---- typed access to a JSON object's keys, recording problems ------------------------------

type problems struct {
	list  []Problem
	extra int
}

func (p *problems) add(rank int, key, msg string) {
	if len(p.list) < maxListed {
		p.list = append(p.list, Problem{Rank: rank, Key: key, Message: msg})
	} else {
		p.extra++
	}
}

func (p *problems) done() []Problem {
	if p.extra > 0 {
		p.list = append(p.list, Problem{Rank: -1, Key: "manifest", Message: fmt.Sprintf("%d more problems not listed", p.extra)})
	}
	return p.list
}

type fields struct {
	m      map[string]json.RawMessage
	rank   int
	ps     *problems
	prefix string // the object's path in the manifest, for keys of nested objects
}

func (f fields) bad(key, format string, args ...any) {
	f.ps.add(f.rank, f.prefix+key, fmt.Sprintf(format, args...))
}

func (f fields) has(key string) bool { _, ok := f.m[key]; return ok }

// raw is key's value; a missing key, or null where null is not allowed, is a problem.
func (f fields) raw(key string, nullable bool) (json.RawMessage, bool) {
	v, ok := f.m[key]
	if !ok {
		f.bad(key, "missing")
		return nil, false
	}
	if !nullable && isNull(v) {
		f.bad(key, "null")
		return nil, false
	}
	return v, true
}

func (f fields) str(key string) string {
	raw, ok := f.raw(key, false)
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		f.bad(key, "%.40s is not a string", raw)
	}
	return s
}

func (f fields) uint(key string) (uint64, bool) {
	raw, ok := f.raw(key, false)
	if !ok {
		return 0, false
	}
	v, ok := parseUint(raw)
	if !ok {
		f.bad(key, "%.40s is not a non-negative integer", raw)
	}
	return v, ok
}

func (f fields) optUint(key string) (*uint64, bool) {
	raw, ok := f.raw(key, true)
	if !ok {
		return nil, false
	}
	if isNull(raw) {
		return nil, true
	}
	v, ok := parseUint(raw)
	if !ok {
		f.bad(key, "%.40s is not a non-negative integer or null", raw)
		return nil, false
	}
	return &v, true
}

// smallInt is a place coordinate: checked against the layout's sizes later, so a value
// too large for an int is clamped (and then refused there).
func (f fields) smallInt(key string) int {
	v, ok := f.uint(key)
	if !ok {
		return -1
	}
	return int(min(v, 1<<31-1))
}

// below checks a place coordinate against its layout size.
func (f fields) below(key string, v, size int, sizeKey string) bool {
	if v < 0 {
		return false // already reported
	}
	if v >= size {
		f.bad(key, "%d is not below layout.%s %d", v, sizeKey, size)
		return false
	}
	return true
}

var uintText = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)

// parseUint reads a JSON number that is a non-negative integer written as one (no
// fraction, no exponent), as the manifest's writer writes them.
func parseUint(raw json.RawMessage) (uint64, bool) {
	s := string(bytes.TrimSpace(raw))
	if !uintText.MatchString(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }
