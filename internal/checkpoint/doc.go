// Package checkpoint owns the capture checkpoint file (docs/CHECKPOINTS.md): its JSON
// format, checking it against the stream it describes, and cutting a stream back to it.
// The Python client writes checkpoints; `strapd resume` reads them.
package checkpoint
