package pipeline

import (
	"errors"
	"fmt"
)

// Kind classifies a session failure in the pipeline's own terms; the server maps each kind
// to a wire error code in one table, so this package never speaks the protocol.
type Kind uint8

// Failure kinds.
const (
	// KindInternal: a failure of the daemon itself (a cancelled wait, a full pool).
	KindInternal Kind = iota
	// KindBadRequest: the request or a notice contradicts itself or the session's state
	// without being about ring contents (a resume without append_at, a DROP without name).
	KindBadRequest
	// KindRingSize: the ring's size is not one the ring layout allows.
	KindRingSize
	// KindRingNotSealed: the ring is not a sealed memfd, so a client could shrink it under us.
	KindRingNotSealed
	// KindRingHeader: the ring's header is not the layout we read.
	KindRingHeader
	// KindBadOutput: the output cannot carry the stream (header write, resume prefix).
	KindBadOutput
	// KindBadCodec: the codec or its error bound is unknown or incomplete.
	KindBadCodec
	// KindMemoryBudget: the session does not fit in the daemon's memory limit.
	KindMemoryBudget
	// KindTornRecord: sequence numbers do not follow on (a record or notice went missing).
	KindTornRecord
	// KindBadRecord: a published window or record is malformed.
	KindBadRecord
	// KindWrite: writing or syncing the stream failed.
	KindWrite
	// KindCodec: compressing a block failed or broke its error bound.
	KindCodec
)

// kindNames are what logs and the END packet's error text call each kind. They are the
// words the END text has always used, so streams read the same whoever maps the codes.
var kindNames = [...]string{
	KindInternal: "internal", KindBadRequest: "bad_message", KindRingSize: "ring_size",
	KindRingNotSealed: "ring_not_sealed", KindRingHeader: "ring_header", KindBadOutput: "bad_output",
	KindBadCodec: "bad_codec", KindMemoryBudget: "memory_budget", KindTornRecord: "torn_record",
	KindBadRecord: "bad_record", KindWrite: "write_error", KindCodec: "codec_error",
}

// String names the kind (in logs and in the END packet's error text).
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Error is a session failure of a known kind.
type Error struct {
	Kind Kind
	Err  error
}

// Error formats the kind and cause.
func (e *Error) Error() string { return e.Kind.String() + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func errf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Err: fmt.Errorf(format, args...)}
}

// KindOf is err's kind: that of the first *Error in its chain, KindInternal when none.
func KindOf(err error) Kind {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Kind
	}
	return KindInternal
}
