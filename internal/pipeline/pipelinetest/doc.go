// Package pipelinetest holds test helpers shared by the daemon's tests: an independent,
// strict reader of finished stream files (docs/STREAM_FORMAT.md) that checks every CRC and
// decodes every payload, and deterministic tensor generators.
package pipelinetest
