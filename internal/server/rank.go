package server

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/strap-llm/strap/internal/control"
)

// maxRankText bounds the host name and job id a session's rank carries: they become label
// values of the per-session metrics and fields of STATUS (a DNS name is at most 253 bytes).
const maxRankText = 255

// sessionRank reads OPEN's metadata.distributed (docs/DISTRIBUTED.md): nil for a single
// process (no such key), the session's rank otherwise. One that is not what the client
// documents (rank and world_size integers, rank below world_size; host and job_id
// strings) refuses the OPEN rather than label a session with a wrong rank.
func sessionRank(meta map[string]any) (*control.SessionRank, error) {
	v, ok := meta["distributed"]
	if !ok || v == nil {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return perr(control.CodeBadMessage, "OPEN metadata.distributed: "+format, args...)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, bad("%v", err)
	}
	var d struct {
		Rank      *uint64 `json:"rank"`
		WorldSize *uint64 `json:"world_size"`
		LocalRank *uint64 `json:"local_rank"`
		Host      *string `json:"host"`
		JobID     *string `json:"job_id"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, bad("%v (rank, world_size and local_rank are non-negative integers; host and job_id strings)", err)
	}
	switch {
	case d.Rank == nil || d.WorldSize == nil:
		return nil, bad("rank and world_size are required")
	case *d.Rank >= *d.WorldSize:
		return nil, bad("rank %d is not below world_size %d", *d.Rank, *d.WorldSize)
	}
	r := &control.SessionRank{Rank: *d.Rank, WorldSize: *d.WorldSize, LocalRank: d.LocalRank}
	for _, f := range []struct {
		name string
		v    *string
		dst  *string
	}{{"host", d.Host, &r.Host}, {"job_id", d.JobID, &r.JobID}} {
		if f.v == nil {
			continue
		}
		if len(*f.v) > maxRankText || !utf8.ValidString(*f.v) {
			return nil, bad("%s is not UTF-8 text of at most %d bytes", f.name, maxRankText)
		}
		*f.dst = *f.v
	}
	return r, nil
}
