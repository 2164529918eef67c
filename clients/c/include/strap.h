/*
 * strap.h — libstrap, the C client of strapd (docs/C_CLIENT.md).
 *
 * One session streams tensors into a sealed memfd ring shared with strapd, which writes them
 * to a capture stream (docs/PROTOCOL.md, docs/STREAM_FORMAT.md). The library depends on libc
 * only, never prints, never exits, and allocates nothing on the per-record path.
 *
 * Conventions
 *   - Every function that can fail returns an int: STRAP_OK (0), a positive notice
 *     (STRAP_DROPPED), or a negative STRAP_E_* code. strap_errstr() names a code; the detailed
 *     message of a session's last failure is read with strap_session_last_error(), that of a
 *     failed strap_session_open() / strap_status() through their strap_error argument.
 *   - Handles are opaque and created and freed in pairs (strap_session_open / _free).
 *   - Parameter structs are filled by strap_default_*_params() first, so fields added in later
 *     versions never break callers.
 *
 * Thread-safety (also per function below)
 *   - strap_errstr, strap_default_*_params, strap_resolve_socket_path, strap_dtype_size,
 *     strap_ggml_type_*: safe from any thread.
 *   - strap_session_*: one session may be used from several threads; its calls are serialized
 *     by the session's own lock (they never run at the same time). strap_session_free must not
 *     race with any other call on the same session.
 *   - Different sessions are independent.
 */
#ifndef STRAP_H
#define STRAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The shared library exports only what is declared with STRAP_API. STRAP_NO_EXPORT: nothing
 * (libstrap compiled into another library, as the Python client's extension does). */
#if defined(STRAP_NO_EXPORT)
#define STRAP_API
#elif defined(__GNUC__)
#define STRAP_API __attribute__((visibility("default")))
#else
#define STRAP_API
#endif

#define STRAP_VERSION_MAJOR 0
#define STRAP_VERSION_MINOR 1
#define STRAP_VERSION_PATCH 0
#define STRAP_VERSION_STRING "0.1.0"

/* ----- errors ------------------------------------------------------------------------- */

/* Return codes. 0 and positive values are not failures. */
enum strap_status_code {
	STRAP_OK = 0,
	/* A tensor was not written under policy STRAP_POLICY_DROP (the ring was full): the
	 * daemon was sent a DROP for it, so the stream records the loss. */
	STRAP_DROPPED = 1,

	STRAP_E_INVALID = -1,     /* a bad argument (the message says which) */
	STRAP_E_NOMEM = -2,       /* out of memory (only at open) */
	STRAP_E_SYSTEM = -3,      /* a system call failed (the message names it and errno) */
	STRAP_E_CONNECT = -4,     /* no strapd answers and none could be started */
	STRAP_E_CLOSED = -5,      /* the daemon closed the connection (EOF, EPIPE, ECONNRESET) */
	STRAP_E_PROTOCOL = -6,    /* the daemon sent something malformed or unexpected */
	STRAP_E_DAEMON = -7,      /* the daemon answered ERROR (strap_error.daemon_code says which) */
	STRAP_E_TIMEOUT = -8,     /* the daemon did not answer (or release ring space) in time */
	STRAP_E_STATE = -9,       /* the session already failed or was closed */
	STRAP_E_TOO_LARGE = -10,  /* a name, meta, message or tensor exceeds a protocol limit */
	STRAP_E_CHECKPOINT = -11, /* a checkpoint file is missing, malformed or does not match */
	STRAP_E_IN_USE = -12,     /* the output is being written by another live capture */
	STRAP_E_BUSY = -13        /* reservations not yet committed or aborted stand in the way */
};

/* The detail of a failure. */
typedef struct strap_error {
	int code;             /* a STRAP_E_* code, STRAP_OK when there was no failure */
	int fatal;            /* 1 when the session cannot go on (only strap_session_free helps) */
	char daemon_code[64]; /* STRAP_E_DAEMON: the ERROR's code ("torn_record", "write_error"...) */
	char message[1024];   /* a sentence naming what failed; truncated to fit */
} strap_error;

/* A static, human-readable name of a return code ("invalid argument", ...). Never NULL.
 * Thread-safe. */
STRAP_API const char *strap_errstr(int code);

/* ----- dtypes ------------------------------------------------------------------------- */

/* Element types, numbered as on the wire and in the stream (STREAM_FORMAT.md 4). */
typedef enum strap_dtype {
	STRAP_DTYPE_F32 = 1,
	STRAP_DTYPE_F16 = 2,
	STRAP_DTYPE_BF16 = 3,
	STRAP_DTYPE_F64 = 4,
	STRAP_DTYPE_I8 = 5,
	STRAP_DTYPE_U8 = 6,
	STRAP_DTYPE_I16 = 7,
	STRAP_DTYPE_I32 = 8,
	STRAP_DTYPE_I64 = 9,
	STRAP_DTYPE_BOOL = 10,
	STRAP_DTYPE_F8_E4M3 = 11,
	STRAP_DTYPE_F8_E5M2 = 12
} strap_dtype;

/* Bytes per element of a dtype, 0 for an unknown one. Thread-safe. */
STRAP_API size_t strap_dtype_size(int dtype);

/* ggml's tensor types as ggml numbers them (enum ggml_type), so that a llama.cpp caller can
 * pass tensor->type without including ggml here. The float and integer types map onto
 * strap_dtype; the quantized ones are stored as raw blocks (STREAM_FORMAT.md 4.1). */
enum strap_ggml_type {
	STRAP_GGML_F32 = 0,
	STRAP_GGML_F16 = 1,
	STRAP_GGML_Q4_0 = 2,
	STRAP_GGML_Q4_1 = 3,
	STRAP_GGML_Q5_0 = 6,
	STRAP_GGML_Q5_1 = 7,
	STRAP_GGML_Q8_0 = 8,
	STRAP_GGML_Q8_1 = 9,
	STRAP_GGML_Q2_K = 10,
	STRAP_GGML_Q3_K = 11,
	STRAP_GGML_Q4_K = 12,
	STRAP_GGML_Q5_K = 13,
	STRAP_GGML_Q6_K = 14,
	STRAP_GGML_Q8_K = 15,
	STRAP_GGML_IQ2_XXS = 16,
	STRAP_GGML_IQ2_XS = 17,
	STRAP_GGML_IQ3_XXS = 18,
	STRAP_GGML_IQ1_S = 19,
	STRAP_GGML_IQ4_NL = 20,
	STRAP_GGML_IQ3_S = 21,
	STRAP_GGML_IQ2_S = 22,
	STRAP_GGML_IQ4_XS = 23,
	STRAP_GGML_I8 = 24,
	STRAP_GGML_I16 = 25,
	STRAP_GGML_I32 = 26,
	STRAP_GGML_I64 = 27,
	STRAP_GGML_F64 = 28,
	STRAP_GGML_IQ1_M = 29,
	STRAP_GGML_BF16 = 30,
	STRAP_GGML_TQ1_0 = 34,
	STRAP_GGML_TQ2_0 = 35,
	STRAP_GGML_MXFP4 = 39
};

/* ggml's lowercase name of a type ("q4_0", "f32"), NULL when this library does not know it.
 * Thread-safe. */
STRAP_API const char *strap_ggml_type_name(int ggml_type);

/* Bytes of one row of ne0 elements of a ggml type; 0 when the type is unknown or ne0 is not
 * a whole number of its blocks. Thread-safe. */
STRAP_API size_t strap_ggml_row_size(int ggml_type, int64_t ne0);

/* ----- socket resolution -------------------------------------------------------------- */

/* Resolve the control socket as PROTOCOL.md 1 says, first match wins: `explicit_path`;
 * $STRAPD_SOCKET; /run/strapd/strapd.sock when it exists; $XDG_RUNTIME_DIR/strapd/strapd.sock;
 * /tmp/strapd-$UID/strapd.sock. Writes a NUL-terminated path into buf.
 * Returns STRAP_OK, or STRAP_E_TOO_LARGE when it does not fit `len` bytes. Thread-safe
 * (reads the environment: do not call setenv concurrently). */
STRAP_API int strap_resolve_socket_path(const char *explicit_path, char *buf, size_t len);

/* ----- sessions ----------------------------------------------------------------------- */

typedef struct strap_session strap_session;

typedef enum strap_policy {
	STRAP_POLICY_BLOCK = 0, /* lossless: the writer waits for ring space */
	STRAP_POLICY_DROP = 1   /* a tensor that does not fit now is dropped (and a DROP sent) */
} strap_policy;

/* Everything strap_session_open needs. Fill with strap_default_session_params() first. */
typedef struct strap_session_params {
	/* Where the capture goes (required). The library opens it itself (O_RDWR|O_CREAT, takes
	 * flock(LOCK_EX), truncates it unless resuming) and passes the descriptor to strapd. In one
	 * rank of several (RANK, WORLD_SIZE > 1) the rank's own name instead, as is an explicit
	 * checkpoint_path (strap_session_output_path says which; STRAP_RANK_STREAMS=0 keeps both). */
	const char *output_path;

	/* Control socket: NULL resolves it (strap_resolve_socket_path). */
	const char *socket_path;
	/* Start `strapd serve` (detached, log beside the socket) when nobody answers. Default 1. */
	int autostart;
	/* The binary to start: NULL takes $STRAPD_BIN, then `strapd` on PATH. */
	const char *strapd_bin;
	/* Seconds to wait for a started daemon to accept. Default 10. */
	double start_timeout_s;

	/* Ring bytes, header included: 4096 + a positive multiple of 64 (clamped down to the
	 * daemon's max_ring_size). 0 (default): 64 MiB, made smaller when the daemon's memory
	 * budget (strapd serve --memory-limit) has less room; a size set here is refused with
	 * STRAP_E_DAEMON "memory_budget" instead (docs/DEPLOY.md, rings and the budget). */
	uint64_t ring_size;
	/* Stream codec: "none" (default), "lz4", "zstd", "shuffle", "quant", "fp16" or "fp8"
	 * (testdata/codec-table/codecs.json; strap_session_open refuses another name, a level
	 * outside the codec's range or a lossy mode it does not take with STRAP_E_INVALID). */
	const char *codec;
	/* Codec level; -1 (default) leaves it to the daemon. */
	int codec_level;
	/* Raw bytes per compression block; 0 (default) leaves it to the daemon. */
	uint32_t block_size;
	/* Lossy codecs only: the error bound ("rel"/"abs" and its value); NULL = none. */
	const char *lossy_mode;
	double lossy_value;
	strap_policy policy;
	/* Bytes of compression buffers to ask the daemon to budget; 0 = no hint. */
	uint64_t memory_hint;
	/* A JSON object whose members are added to OPEN's metadata (model_class, ...); NULL =
	 * none. The library adds "client", "fingerprint" and "output_path" before them. */
	const char *metadata_json;
	/* The client name in HELLO and the metadata. Default "libstrap/<version>". */
	const char *client_name;

	/* Ask strapd for its kernel trace into "<output>.trace.jsonl". Default 0. */
	int trace;
	/* Open "<output>.resources.jsonl" as the session's resource log (RESOURCES). Default 0. */
	int resources;

	/* Checkpoints (docs/CHECKPOINTS.md): strap_session_checkpoint writes the checkpoint file
	 * (NULL: "<output>.ckpt.json"). It is deleted after a clean strap_session_close. */
	const char *checkpoint_path;
	/* Identifies the capture config and model; stored in the stream header's metadata and
	 * in each checkpoint, and compared on resume. NULL = "". */
	const char *fingerprint;
	/* Resume (docs/CHECKPOINTS.md 4, the Python client's scan: common/strap_resume.c): the
	 * checkpoint file, when there is one, is the floor (every packet of its prefix read and
	 * CRC-checked, the counts and its last packet as it says); past it — from the first packet
	 * without one — the stream's intact run of packets (each whole, its CRC32C right, TOKENs
	 * numbered on) is kept up to its last TOKEN packet. The open cuts the stream there and the
	 * session continues after its last sequence number; strap_session_resume_point says
	 * from which token and forward pass. An empty stream, or one with no token intact, starts
	 * over from token 0; a stream of another fingerprint, or not a strap stream, is refused
	 * (STRAP_E_CHECKPOINT, nothing changed). A capture that finished (END "complete") is never
	 * resumed: STRAP_E_CHECKPOINT, the stream left as it is (with resume_max_tokens >= 0 the
	 * job decides: strap_resume_probe reports it); one with its checkpoint still beside it was
	 * stopped by an error, or ended between its END and the checkpoint's removal, and resumes
	 * (docs/CHECKPOINTS.md 4). params.resume_token receives the kept tokens. */
	int resume;
	/* Start over although a checkpoint file exists (it is deleted). Without this, and
	 * without resume, an existing checkpoint file is an error (STRAP_E_CHECKPOINT). */
	int overwrite_checkpoint;

	/* Seconds to wait for ring space, or for strapd's answer (WELCOME, OPENED, CHECKPOINTED,
	 * CLOSED), before STRAP_E_TIMEOUT. Default 120. */
	double stall_timeout_s;
	/* Largest record; larger tensors go as PART records. 0: a quarter of the data region; at
	 * most half of it. */
	uint64_t part_size;
	/* Unpublished bytes that trigger a PUBLISH before strap_session_flush. 0: an eighth of
	 * the data region, at most 4 MiB. */
	uint64_t publish_bytes;
	/* Reservations (strap_session_reserve) outstanding at once, at most; the table is
	 * allocated at open. 0: 64. */
	uint32_t max_reservations;
	/* Ring tokens (PROTOCOL.md 1.4, "TOKEN records"): where strapd offers them and the
	 * published cursor, and the session has no trace file (a trace's per-token counters are
	 * read as each TOKEN message arrives), a token with a position (>= 0) goes into the ring as
	 * a TOKEN record, the published cursor is stored past it, and one PUBLISH names the records
	 * and tokens once this many tokens wait, or ring_tokens_seconds after the last message:
	 * strapd wakes once per several tokens instead of once per token. 0: 16; 1: one TOKEN
	 * message per token. A token whose record does not fit the ring now goes as a message
	 * (a token never waits for ring space). */
	uint32_t ring_tokens_every;
	/* 0: 0.25 s. */
	double ring_tokens_seconds;

	/* Object storage (docs/OBJECT_STORAGE.md; PROTOCOL.md 1.3 "upload"): strapd uploads the
	 * stream while it writes it, as "<upload>/<base name of the output>", with the trace and
	 * the resource log beside it. "s3://bucket" or "s3://bucket/prefix", checked at open as the
	 * Python client and strapd check it (STRAP_E_INVALID: not s3://, a bucket name S3 refuses, an
	 * empty, "." or ".." prefix segment). NULL or "" (default): none, and strapd's own
	 * `serve --upload` target applies if it has one; strap_session_upload names the object
	 * either way. A target strapd refuses (not allowed, no object storage) fails the open with
	 * STRAP_E_DAEMON "upload_refused". */
	const char *upload;
	/* Let strapd free the stream's uploaded bytes on the local disk while the capture runs
	 * (`serve --upload-free-local` for this session). Needs an upload, the session's or
	 * strapd's own, else the open fails with STRAP_E_DAEMON "bad_message". Default 0. */
	int upload_free_local;

	/* The job-wide resume point (docs/DISTRIBUTED.md D3): with resume, keep at most this many
	 * tokens — the fewest any rank of the job can keep (strap_resume_probe on every rank, then
	 * the minimum through the job's own channel: MPI_Allreduce, a store...). A point before the
	 * checkpoint rewrites the checkpoint to it first. -1 (default): this process's own point —
	 * or, in one rank of a job under torchrun (TORCHELASTIC_RUN_ID naming the launch, not
	 * "none", TORCHELASTIC_RESTART_COUNT, per-rank stream names), the job's, agreed as the Python
	 * client agrees it without torch.distributed: each rank writes "{stream}.job-resume.json"
	 * and waits (up to $STRAP_JOB_RESUME_WAIT seconds, 600) for every other rank's in the same
	 * directory, C and Python ranks alike (strap_resume_point.job_agreed says so). */
	int64_t resume_max_tokens;
	/* The tokens of the kept prefix, for the caller's per-token state (a generation loop goes on
	 * from them): called by a resuming strap_session_open and by strap_resume_probe with each one,
	 * index 0 first and in order, as its TOKEN packet holds it (strap_session_token's arguments;
	 * token_id and position INT64_MIN when the stream holds no integer there, position the index
	 * when it holds none; text UTF-8, text_len bytes, not NUL-terminated) — or, for a prefix freed
	 * after its upload, as the checkpoint's token log holds it. A token of index 0 after others
	 * starts the list over (a job's point found again, before the open returns). Non-zero stops
	 * the open: STRAP_E_CHECKPOINT, nothing changed. On any failure the tokens given are void.
	 * NULL (default): not called. */
	int (*resume_token)(void *user, uint64_t index, int64_t token_id, const char *text, size_t text_len,
			    int64_t position);
	void *resume_token_user;
} strap_session_params;

/* The defaults above. Thread-safe. */
STRAP_API strap_session_params strap_default_session_params(void);

/* Where a session starts (a fresh one: all zero). */
typedef struct strap_resume_point {
	int resumed;            /* 1 when a checkpoint was resumed */
	uint64_t token_count;   /* tokens already in the stream: the next token's index */
	uint64_t forward_count; /* forward passes already captured: the next one's number */
	uint64_t last_seq;      /* the last sequence number in the kept prefix */
	uint64_t stream_offset; /* bytes of stream kept */
	int from_stream;        /* 1: the point lies past the checkpoint (or there is none) */
	int complete;           /* strap_resume_probe: the stream is a finished capture's */
	int job_agreed;         /* 1: the point is the job's, agreed with the other ranks (torchrun) */
} strap_resume_point;

/* Connect (starting strapd when allowed), shake hands, create the ring, open the output
 * (and trace / resource log / checkpoint state) and send OPEN. On success *out is the
 * session; on failure *out is NULL and `err` (may be NULL) says why.
 * Thread-safe (each call makes its own session). */
STRAP_API int strap_session_open(const strap_session_params *params, strap_session **out, strap_error *err);

/* Where params.resume would go on (params.output_path, .checkpoint_path, .fingerprint,
 * .resume_max_tokens; one rank's own paths in a distributed job), changing nothing: no
 * connection, no cut; the stream lock is taken while it reads (a capture still ending is waited
 * for, a live one is STRAP_E_IN_USE). *out all zero: a new capture (no stream, an empty one, no token
 * intact). out->complete: the stream is a finished capture's (strap_session_open refuses it
 * unless resume_max_tokens >= 0). A job calls it on every rank, takes the smallest token_count
 * and opens every rank with resume_max_tokens set to it; when every rank is complete there is
 * nothing to resume. Under torchrun the probe gives this rank's own point; the open then agrees
 * with the other ranks itself (params.resume_max_tokens). Errors as strap_session_open's resume.
 * Thread-safe. */
STRAP_API int strap_resume_probe(const strap_session_params *params, strap_resume_point *out, strap_error *err);

/* Where the session started (resume). Thread-safe. */
STRAP_API strap_resume_point strap_session_resume_point(const strap_session *s);

/* The object strapd uploads the stream into ("s3://bucket/key"; OPENED's "upload"): the
 * session's params.upload or strapd's own target; NULL when the stream is not uploaded. Valid
 * until strap_session_free. Thread-safe. */
STRAP_API const char *strap_session_upload(const strap_session *s);

/* The stream the session writes, absolute: params.output_path, or in one rank of a
 * distributed job (RANK and WORLD_SIZE > 1 set by the launcher, STRAP_RANK_STREAMS not 0) its
 * per-rank name {stem}.rank{RANK:05d}-of-{WORLD_SIZE:05d}{ext} (docs/DISTRIBUTED.md). Valid until
 * strap_session_free. Thread-safe. */
STRAP_API const char *strap_session_output_path(const strap_session *s);

/* Start a forward pass: the records written until the next call carry step = tokens
 * recorded so far and forward = this pass's number (0-based, continuing after a resume).
 * Thread-safe (serialized). */
STRAP_API int strap_session_begin_forward(strap_session *s);

/* Override step and forward for the records that follow (callers that count themselves; the
 * next begin_forward continues after `forward`). Thread-safe (serialized). */
STRAP_API int strap_session_set_step(strap_session *s, uint64_t step, uint64_t forward);

/* Write one tensor: `data` holds `nbytes` bytes in C order, little-endian, and nbytes must
 * equal the product of `shape` (ndim 0..8; ndim 0 is a scalar) times strap_dtype_size(dtype).
 * `name` is UTF-8, 1..4096 bytes. `meta_json` is NULL or a JSON object (≤ 65536 bytes),
 * stored with the record. Returns STRAP_OK, STRAP_DROPPED (policy drop, ring full), or an
 * error. Tensors larger than the part size go as PART records. No allocation.
 * Thread-safe (serialized). */
STRAP_API int strap_session_write(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim,
				  const void *data, size_t nbytes, const char *meta_json);

/* Copies `len` bytes of a tensor's payload, starting at byte `offset` of its C-order bytes, to
 * `dst` (in the ring). Returns 0, or non-zero when it cannot (the write then fails). */
typedef int (*strap_copy_fn)(void *ctx, void *dst, size_t offset, size_t len);

/* strap_session_write with the payload produced by `fn` straight into the ring instead of read
 * from a pointer: a tensor in device memory (ggml_backend_tensor_get) or not contiguous is
 * copied once, with no staging buffer. `fn` is called once per record (once, or per PART
 * record, in order), under the session's lock: it must not call into the session. A failure
 * before any byte was committed writes nothing (STRAP_E_INVALID, the session goes on); one
 * after a first PART record ends the session (STRAP_E_SYSTEM), as the stream would otherwise hold
 * a cut tensor. Thread-safe (serialized). */
STRAP_API int strap_session_write_with(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim,
				       size_t nbytes, const char *meta_json, strap_copy_fn fn, void *ctx);

/* Write a ggml tensor given as ggml describes it: `ggml_type` (enum ggml_type), ne[0..n_dims-1]
 * (ne[0] innermost) and its contiguous bytes. Float and integer types are written as their
 * strap_dtype with shape ne reversed; quantized types as raw blocks (dtype u8, shape
 * [ne[n-1], ..., ne[1], row bytes], meta {"ggml_type":"q4_0","ggml_ne":[...]}: STREAM_FORMAT.md
 * 4.1). Thread-safe (serialized). */
STRAP_API int strap_session_write_ggml(strap_session *s, const char *name, int ggml_type, const int64_t *ne, int n_dims,
				       const void *data, size_t nbytes);

/* strap_session_write_ggml with the payload produced by `fn` (see strap_session_write_with):
 * for a ggml tensor in a backend buffer, fn can call ggml_backend_tensor_get. Thread-safe. */
STRAP_API int strap_session_write_ggml_with(strap_session *s, const char *name, int ggml_type, const int64_t *ne,
					    int n_dims, size_t nbytes, strap_copy_fn fn, void *ctx);

/* ----- reserve / commit: asynchronous copies (the CUDA path) ----------------------------
 *
 * strap_session_reserve places one TENSOR record's header in the ring and hands back where its
 * payload goes; the caller fills it later, from any thread and without the session's lock (a
 * device-to-host cudaMemcpyAsync into the ring mapping, registered once with cudaHostRegister:
 * strap_session_ring), then calls strap_session_commit once the bytes have landed (its CUDA
 * event completed) or strap_session_abort when they never will. docs/C_CLIENT.md, "Reserve and
 * commit", says it at length:
 *   - The record takes its sequence number, step and forward at reserve, in ring order with
 *     every other record; reservations may be committed in any order, and strapd is told
 *     (PUBLISH, the published cursor) only of the records below the oldest reservation not yet
 *     committed.
 *   - An aborted reservation becomes a PAD and, once every record before it is published, a
 *     DROP with reason "aborted" takes its sequence number: the stream records the loss.
 *   - Backpressure: a reservation (or write) that needs ring space only the outstanding
 *     reservations hold returns STRAP_E_BUSY at once instead of waiting (policy drop: instead
 *     of a DROP, which could not be sent in sequence order); as do strap_session_token,
 *     _checkpoint and _close while a reservation is outstanding. STRAP_E_BUSY ends nothing:
 *     commit or abort, then call again. strap_session_flush publishes the committed prefix.
 */

/* One reserved record. Filled by strap_session_reserve; passed back to commit or abort. */
typedef struct strap_reservation {
	void *data;           /* where the payload goes: nbytes bytes inside the ring mapping */
	size_t nbytes;        /* the tensor's bytes */
	uint64_t ring_offset; /* data's offset from the mapping's start (strap_session_ring) */
	uint64_t seq;         /* the record's sequence number */
	uint32_t slot;        /* the library's own */
} strap_reservation;

/* Reserve one record for a tensor (arguments as strap_session_write, without the payload).
 * The record must be whole: header + nbytes rounded up to 64 at most the part size
 * (params.part_size), else STRAP_E_TOO_LARGE. Waits for ring space under policy block as write
 * does; STRAP_E_BUSY (nothing taken) when only committing outstanding reservations would make
 * room, or params.max_reservations are outstanding; STRAP_DROPPED under policy drop (a DROP
 * was sent; *out is zeroed). On STRAP_OK, out->data is valid until commit or abort. No
 * allocation. Thread-safe (serialized). */
STRAP_API int strap_session_reserve(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim,
				    size_t nbytes, const char *meta_json, strap_reservation *out);

/* The payload of a reservation is complete: the record may be published. A reservation not
 * outstanding (committed or aborted already, or of another session) is STRAP_E_INVALID and
 * changes nothing. Thread-safe (serialized). */
STRAP_API int strap_session_commit(strap_session *s, const strap_reservation *r);

/* The payload will never be complete (the copy failed): the record is turned into a PAD and
 * a DROP "aborted" takes its sequence number; nothing may be written into r->data after it.
 * Thread-safe (serialized). */
STRAP_API int strap_session_abort(strap_session *s, const strap_reservation *r);

/* The ring mapping (for cudaHostRegister): its address and size in bytes, valid until
 * strap_session_free. Thread-safe. */
STRAP_API int strap_session_ring(const strap_session *s, void **addr, size_t *size);

/* Publish every record written so far (call once per forward pass). Thread-safe. */
STRAP_API int strap_session_flush(strap_session *s);

/* Record one generated token: it becomes a TOKEN packet with step = its index (the number of
 * tokens recorded before it). `text` is UTF-8 of `text_len` bytes (may be 0); `position` < 0
 * leaves it to the daemon (= index). Sent right after the token is generated. Thread-safe. */
STRAP_API int strap_session_token(strap_session *s, int64_t token_id, const char *text, size_t text_len,
				  int64_t position);

/* Make every event so far durable (CHECKPOINT → CHECKPOINTED) and write the checkpoint file
 * (temp file, fsync, rename, directory fsync). Thread-safe (serialized). */
STRAP_API int strap_session_checkpoint(strap_session *s);

/* Send resource events (docs/RESOURCE_EVENTS.md): `events[i]` is one JSON object with a
 * non-empty string "event", `lens[i]` its bytes. They are packed into as few RESOURCES
 * messages as fit 64 KiB, never split. Needs params.resources. Thread-safe (serialized). */
STRAP_API int strap_session_resources(strap_session *s, const char *const *events, const size_t *lens, size_t n);

/* Totals the daemon reported in CLOSED. */
typedef struct strap_closed {
	uint64_t packets, drops, bytes_in, bytes_out, file_bytes;
} strap_closed;

/* Send CLOSE and wait for CLOSED: the stream then has its END, index and footer and is
 * synced. The checkpoint file is deleted. `out` may be NULL. After it only _free is useful.
 * With a reservation outstanding nothing is sent: STRAP_E_BUSY, the session goes on (commit or
 * abort it, then close). Thread-safe (serialized). */
STRAP_API int strap_session_close(strap_session *s, strap_closed *out);

/* The session's counters (records and tokens sent, drops; publishes: PUBLISH messages — a
 * TOKEN that names the records before it, to a daemon that takes the published cursor, is
 * not one). Thread-safe. */
typedef struct strap_session_stats {
	uint64_t records, tokens, drops, drop_bytes, bytes_in, publishes, checkpoints;
	uint64_t session_id;    /* OPENED's session number */
	uint64_t ring_size;     /* the ring in use (params.ring_size clamped to the daemon's max_ring_size) */
	uint64_t reserved;      /* reservations outstanding (neither committed nor aborted) */
	uint64_t aborts;        /* reservations aborted (each a DROP "aborted", counted in drops once sent) */
	uint64_t token_records; /* tokens written into the ring as TOKEN records (params.ring_tokens_every) */
} strap_session_stats;
STRAP_API strap_session_stats strap_session_get_stats(strap_session *s);

/* Copy the session's last failure into *out (code STRAP_OK when none). Thread-safe. */
STRAP_API void strap_session_last_error(strap_session *s, strap_error *out);

/* Release the socket, ring and files. A session not closed ends, for strapd, as a client that
 * went away (END status "aborted"). NULL is a no-op. Not thread-safe against other calls on s. */
STRAP_API void strap_session_free(strap_session *s);

/* ----- status ------------------------------------------------------------------------- */

/* Ask the daemon at `socket_path` (NULL: resolved; never autostarted) for STATUS_REPLY and
 * copy its JSON body, NUL-terminated, into buf. *needed (may be NULL) gets the body's
 * length + 1; STRAP_E_TOO_LARGE when it does not fit. Thread-safe. */
STRAP_API int strap_status(const char *socket_path, char *buf, size_t len, size_t *needed, strap_error *err);

#ifdef __cplusplus
}
#endif

#endif /* STRAP_H */
