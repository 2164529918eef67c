// Package pipelinetest holds test helpers shared by the daemon's tests: a whole-file view
// of a finished stream, read with internal/stream's reader (every CRC checked, every payload
// decoded), and deterministic tensor generators.
package pipelinetest
