/*
 * The resource instrumentation's state, shared by its three parts (private to libstrap):
 * resource.c (the API's life cycle, sessions, context and control), resource_events.c (the
 * model's thread: the LOG_* calls turned into plain records, handed to the writer in batches)
 * and resource_writer.c (the writer thread: records rendered into events by resource_render.c,
 * sent to strapd or appended to the JSONL file). Data flows one way: model's thread -> records
 * -> writer -> output.
 */
#ifndef STRAP_RESOURCE_INSTR_H
#define STRAP_RESOURCE_INSTR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Internal names, kept out of the application's namespace (as internal.h does). */
#define lri_level_names strap__lri_level_names
#define lri_mono_ns strap__lri_mono_ns
#define lri_wall_ns strap__lri_wall_ns
#define lri_fail strap__lri_fail
#define lri_enter strap__lri_enter
#define lri_leave strap__lri_leave
#define lri_push strap__lri_push
#define lri_keep strap__lri_keep
#define lri_hand_over strap__lri_hand_over
#define lri_queued strap__lri_queued
#define lri_writer_main strap__lri_writer_main
#define lri_iso_now strap__lri_iso_now

#define LLAMA_RESOURCE_NO_GGML
#include "llama-resource-instrumentation.h"
#include "resource_render.h"

/* Events are sent or written once this many bytes wait (and at a pass's end, flush, end). */
#define FLUSH_BYTES (48 * 1024)
/* The model's thread hands its records to the writer at a pass's end, or when this many wait. */
#define HANDOFF_RECORDS 512
#define MINIMAL_ALLOCATION_BYTES (1LL << 20) /* levels.MINIMAL_ALLOCATION_BYTES */
#define FRACTION_MAX_AGE_NS 250000000LL      /* system.FRACTION_MAX_AGE */
#define NAME_LEN 128
#define MAX_INPUTS 8

/* A tensor as a record keeps it: copies, the caller's memory may be gone by the time the writer
 * renders it. */
struct rtensor {
	char name[64];
	char dtype[24];
	int64_t shape[8];
	int ndim; /* -1: none */
	uint64_t nbytes, address;
};

enum rec_kind { R_MUL_MAT, R_OP, R_ALLOC, R_HANDOFF, R_FORWARD, R_LINE, R_SUMMARY };

/* What the model's thread records of one call: plain copies, no formatting (the writer thread
 * makes the events, as the Python client's writer does). */
struct rec {
	enum rec_kind kind;
	long long ts, step, forward, duration_ns;
	int layer, n_in, has_weight, has_input;
	char component[32], module[NAME_LEN], op[32], mlp_op[16], activation[NAME_LEN / 2], kind_word[16];
	char from[32], to[32];
	struct rtensor in[MAX_INPUTS], weight, input, out;
	char *line; /* R_LINE: a prebuilt event (the session start), malloc'd */
};

struct queue {
	struct rec *r;
	size_t n, cap;
};

struct instr {
	int level, enabled;
	int fd;           /* the JSONL file, or -1 */
	strap_session *s; /* or strapd */
	char session_id[160];
	char model_class[NAME_LEN];
	char activation[NAME_LEN / 2];
	int session_open;
	long long step, forward, forwards, forward_start_ns;
	int layer;
	char component[32];
	long long mark_ns; /* the clock's last mark: an operation's duration runs from it */
	/* the last component ended (its end time, its last output) for the handoff */
	char ended[32];
	long long ended_ns;
	struct rtensor last_out;
	long long clock_offset_ns; /* Unix time - monotonic time, read at init */
	long long self_ns;         /* time inside the API's calls (the model's thread) */
	uint64_t filtered;
	struct queue q; /* the model's thread's records, not handed over yet */

	/* the writer thread and what it owns (wmu guards the hand-over and the counters read by
	 * get_stats) */
	pthread_t thread;
	pthread_mutex_t wmu;
	pthread_cond_t wake, idle;
	struct queue wq; /* handed over, waiting for the writer */
	int writer_busy, stop;
	long long seq;
	long long pass_flops, total_flops, component_flows, parameter_bytes, total_compute_ns;
	long long counts[4]; /* compute_execution, mlp_operation, memory_allocation, component_handoff */
	double fraction;
	long long fraction_at;
	lri_buf buf;
	size_t *ends; /* where each waiting event ends in buf */
	size_t n_ends, cap_ends;
	uint64_t events, bytes;
	long long pub_flops; /* total_flops as of the writer's last batch (under wmu) */
	strap_error err;     /* the first error (model's thread: under mu; writer: under wmu) */
};

/* src into dst (truncated to cap - 1 bytes): on the model's thread, so no snprintf */
static inline void lri_copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = src ? strnlen(src, cap - 1) : 0;
	memcpy(dst, src ? src : "", n);
	dst[n] = 0;
}
#define COPY(dst, src) lri_copy_str((dst), sizeof(dst), (src))

/* resource.c: the level names, the clock, the first error, the global instrumentation */
extern const char *const lri_level_names[4];
long long lri_mono_ns(void);
long long lri_wall_ns(void);
/* Keeps the first error (either thread; under wmu); returns code. */
int lri_fail(struct instr *in, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The instrumentation, when one runs (level > 0), with the API's mutex held; else NULL, unlocked. */
struct instr *lri_enter(void);
/* Adds the call's time to self_ns, releases the mutex, returns rc. */
int lri_leave(struct instr *in, long long t0, int rc);

/* resource_events.c: the model's thread's records */
struct rec *lri_push(struct instr *in, enum rec_kind kind, long long now);
void lri_keep(struct rtensor *dst, const llama_resource_tensor *t);
void lri_hand_over(struct instr *in, int wait);
void lri_queued(struct instr *in);

/* resource_writer.c: the writer thread */
void *lri_writer_main(void *arg);
void lri_iso_now(char *out, size_t cap);

#endif
