/* The library's error codes and messages (strap_errstr, the strap_error a call fills). */
#include <stdio.h>

#include "internal.h"

const char *strap_errstr(int code)
{
	switch (code) {
	case STRAP_OK: return "ok";
	case STRAP_DROPPED: return "tensor dropped (ring full, policy drop)";
	case STRAP_E_INVALID: return "invalid argument";
	case STRAP_E_NOMEM: return "out of memory";
	case STRAP_E_SYSTEM: return "system call failed";
	case STRAP_E_CONNECT: return "cannot connect to strapd";
	case STRAP_E_CLOSED: return "connection closed by strapd";
	case STRAP_E_PROTOCOL: return "protocol error";
	case STRAP_E_DAEMON: return "strapd reported an error";
	case STRAP_E_TIMEOUT: return "timed out waiting for strapd";
	case STRAP_E_STATE: return "session already failed or closed";
	case STRAP_E_TOO_LARGE: return "exceeds a protocol limit";
	case STRAP_E_CHECKPOINT: return "checkpoint missing, malformed or not matching";
	case STRAP_E_IN_USE: return "output in use by a live capture";
	case STRAP_E_BUSY: return "reservations outstanding (commit or abort them first)";
	default: return "unknown error code";
	}
}

void se_set(strap_error *e, int code, const char *fmt, ...)
{
	if (!e)
		return;
	e->code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
}
