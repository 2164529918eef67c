// Package httpapi owns strapd's HTTP surface (docs/HTTP_API.md): the JSON API served on a
// Unix socket, where each request is answered for the peer the kernel names (SO_PEERCRED)
// exactly as the control socket would answer it, resource-event logs read from the
// sessions' {output}.resources.jsonl files (with Server-Sent Events to follow them), and
// the TCP listener that serves /metrics.
package httpapi
