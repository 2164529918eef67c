package server

import (
	"errors"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline"
)

// wireCodes is where the pipeline's failure kinds meet the protocol: each kind's ERROR code
// and, where a daemon flag bounds it, the flag to name so the operator knows what to raise.
var wireCodes = map[pipeline.Kind]struct{ code, flag string }{
	pipeline.KindInternal:      {control.CodeInternal, ""},
	pipeline.KindBadRequest:    {control.CodeBadMessage, ""},
	pipeline.KindRingSize:      {control.CodeRingSize, ""},
	pipeline.KindRingNotSealed: {control.CodeRingNotSealed, ""},
	pipeline.KindRingHeader:    {control.CodeRingHeader, ""},
	pipeline.KindBadOutput:     {control.CodeBadOutput, ""},
	pipeline.KindBadCodec:      {control.CodeBadCodec, ""},
	pipeline.KindMemoryBudget:  {control.CodeMemoryBudget, "--memory-limit"},
	pipeline.KindTornRecord:    {control.CodeTornRecord, ""},
	pipeline.KindBadRecord:     {control.CodeBadRecord, ""},
	pipeline.KindWrite:         {control.CodeWrite, ""},
	pipeline.KindCodec:         {control.CodeCodec, ""},
}

// wireError is the fatal ERROR body for any failure: a coded control error as it is, a
// pipeline failure through wireCodes, anything else as internal.
func wireError(err error) control.Error {
	if ce, ok := errors.AsType[*control.Error](err); ok {
		e := *ce
		e.Fatal = true
		return e
	}
	if pe, ok := errors.AsType[*pipeline.Error](err); ok {
		wc, known := wireCodes[pe.Kind]
		if !known {
			wc.code = control.CodeInternal
		}
		msg := pe.Err.Error()
		if wc.flag != "" {
			msg += " (" + wc.flag + ")"
		}
		return control.Error{Code: wc.code, Message: msg, Fatal: true}
	}
	return control.Error{Code: control.CodeInternal, Message: err.Error(), Fatal: true}
}

// perr is a coded failure the server raises itself (a refused descriptor, a quota).
func perr(code string, format string, args ...any) error {
	return control.Errorf(code, format, args...)
}
