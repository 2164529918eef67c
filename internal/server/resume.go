package server

import (
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/stream"
)

// resumeExpect turns OPEN's append_at and resume fields into what the writer checks the
// stream prefix against (docs/CHECKPOINTS.md); nil when the session starts a new stream.
// The prefix itself is read through the output descriptor the client passed, never by path.
func resumeExpect(req control.Open) (*stream.ResumeExpect, error) {
	if req.AppendAt == 0 {
		if req.Resume != nil {
			return nil, perr(control.CodeBadMessage, "OPEN resume without append_at")
		}
		return nil, nil
	}
	if req.Resume == nil {
		return nil, perr(control.CodeBadMessage, "append_at %d without resume {last_seq, last_crc, packets}", req.AppendAt)
	}
	if req.AppendAt > 1<<62 {
		return nil, perr(control.CodeBadMessage, "append_at %d out of range", req.AppendAt)
	}
	return &stream.ResumeExpect{AppendAt: int64(req.AppendAt), LastSeq: req.Resume.LastSeq,
		LastCRC: req.Resume.LastCRC, Packets: req.Resume.Packets}, nil
}
