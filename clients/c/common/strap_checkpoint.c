/* The checkpoint file of docs/CHECKPOINTS.md 3: its encoder and its parser, and the durable
 * writes of the checkpoint and the token log (strap_checkpoint.h). libstrap and the Python
 * client's _speedups extension both compile this file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "strap_checkpoint.h"

/* The format's members, in the order the encoder writes them (Go's checkpoint.Checkpoint). */
static const char *const format_keys[] = {
    "format",          "version",     "stream",        "created",   "fingerprint",
    "stream_offset",   "packets",     "drops",         "last_seq",  "last_packet_offset",
    "last_packet_crc", "token_count", "forward_count", "token_log", "tokens"};

bool
sck_format_key(const char *key, size_t n)
{
    for (size_t i = 0; i < sizeof format_keys / sizeof format_keys[0]; i++)
        if (strlen(format_keys[i]) == n && memcmp(format_keys[i], key, n) == 0)
            return true;
    return false;
}

enum { NKEYS = sizeof format_keys / sizeof format_keys[0] };

/* The format's members of a validated object in one walk (a large "tokens" list is stepped
 * over once, not once a lookup): found[i] is format_keys[i]'s value (the last of a repeated
 * key, as sj_get), n 0 when absent. */
static void
format_members(sj_val doc, sj_val found[NKEYS])
{
    memset(found, 0, sizeof(sj_val) * NKEYS);
    const char *it = doc.p;
    sj_val k, v;
    char key[24];
    bool full;
    while (sj_object_next(doc, &it, &k, &v)) {
        /* a "\u0000" would end the unescaped name early: no format key holds one */
        if (!sj_str(k, key, sizeof key, &full) || !full || memmem(k.p, k.n, "\\u0000", 6))
            continue;
        for (size_t i = 0; i < NKEYS; i++)
            if (strcmp(key, format_keys[i]) == 0) {
                found[i] = v;
                break;
            }
    }
}

/* The value of format key `key` among found (false when absent). */
static bool
get(const sj_val found[NKEYS], const char *key, sj_val *out)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(key, format_keys[i]) == 0) {
            *out = found[i];
            return found[i].n != 0;
        }
    return false;
}

static int fail(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int
fail(char *why, size_t whylen, const char *fmt, ...)
{
    if (why && whylen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A value's JSON text for a message: at most 60 bytes of it (then "..."). */
#define SHOWN(v) (int)((v).n > 60 ? 60 : (v).n), (v).p, (v).n > 60 ? "..." : ""

int
sck_check(const sck_checkpoint *c, char *why, size_t whylen)
{
    if (c->stream_offset == 0 || c->stream_offset > INT64_MAX)
        return fail(why, whylen, "inconsistent numbers: stream_offset %" PRIu64 " (a stream holds at least its header)",
                    c->stream_offset);
    if ((c->packets == 0) != (c->last_seq == 0))
        return fail(why, whylen, "inconsistent numbers: %" PRIu64 " packets with last_seq %" PRIu64, c->packets,
                    c->last_seq);
    if (c->last_seq < c->packets)
        return fail(why, whylen, "inconsistent numbers: last_seq %" PRIu64 " below the packet count %" PRIu64,
                    c->last_seq, c->packets);
    if (c->packets && (c->last_packet_offset == 0 || c->last_packet_offset >= c->stream_offset))
        return fail(why, whylen,
                    "inconsistent numbers: last_packet_offset %" PRIu64 " outside the stream prefix of %" PRIu64
                    " bytes",
                    c->last_packet_offset, c->stream_offset);
    if (c->drops > c->packets || c->token_count > c->packets)
        return fail(why, whylen,
                    "inconsistent numbers: drops %" PRIu64 " / token_count %" PRIu64 " exceed %" PRIu64 " packets",
                    c->drops, c->token_count, c->packets);
    if (c->last_packet_crc > UINT32_MAX || c->last_packet_offset > INT64_MAX)
        return fail(why, whylen,
                    "inconsistent numbers: last_packet_crc %" PRIu64 " / last_packet_offset %" PRIu64 " out of range",
                    c->last_packet_crc, c->last_packet_offset);
    if (c->has_token_log &&
        (c->log_tokens != c->token_count || c->log_bytes > INT64_MAX || c->log_bytes < c->log_tokens ||
         (c->log_tokens == 0) != (c->log_bytes == 0) || c->log_crc32c > UINT32_MAX))
        return fail(why, whylen,
                    "token_log {tokens %" PRIu64 ", bytes %" PRIu64 ", crc32c %" PRIu64
                    "} does not fit token_count %" PRIu64,
                    c->log_tokens, c->log_bytes, c->log_crc32c, c->token_count);
    return 0;
}

/* The rules of internal/checkpoint Parse; the golden files in testdata/checkpoint hold the
 * readers to the same facts. */
int
sck_parse(const char *buf, size_t n, sck_checkpoint *c, char *why, size_t whylen)
{
    memset(c, 0, sizeof *c);
    c->listed_tokens = -1;
    char err[128];
    if (n > SCK_MAX_SIZE)
        return fail(why, whylen, "%zu bytes, larger than a checkpoint may be (64 MiB)", n);
    if (!sj_validate(buf, n, err, sizeof err))
        return fail(why, whylen, "not JSON: %s", err);
    sj_val doc = {buf, n}, v;
    while (doc.n && (*doc.p == ' ' || *doc.p == '\t' || *doc.p == '\n' || *doc.p == '\r'))
        doc.p++, doc.n--;
    if (sj_kind(doc) != '{')
        return fail(why, whylen, "not a JSON object");
    sj_val found[NKEYS];
    format_members(doc, found);
    static const char *const required[] = {"format",     "version",  "fingerprint",        "stream_offset",
                                           "packets",    "last_seq", "last_packet_offset", "last_packet_crc",
                                           "token_count"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!get(found, required[i], &v) || sj_kind(v) == 'z')
            return fail(why, whylen, "missing field '%s'", required[i]);
    char str[32];
    bool full;
    get(found, "format", &v);
    if (!sj_str(v, str, sizeof str, &full) || !full || strcmp(str, "strap-checkpoint") != 0)
        return fail(why, whylen, "format is %.*s%s, expected \"strap-checkpoint\"", SHOWN(v));
    uint64_t ver;
    get(found, "version", &v);
    if (!sj_u64(v, &ver) || ver != 1)
        return fail(why, whylen, "version is %.*s%s, this reader reads 1", SHOWN(v));
    struct {
        const char *k;
        uint64_t *dst;
        uint64_t max;
        const char *below;
    } f[] = {{"stream_offset", &c->stream_offset, INT64_MAX, "2**63"},
             {"packets", &c->packets, UINT64_MAX, "2**64"},
             {"drops", &c->drops, UINT64_MAX, "2**64"},
             {"last_seq", &c->last_seq, UINT64_MAX, "2**64"},
             {"last_packet_offset", &c->last_packet_offset, INT64_MAX, "2**63"},
             {"last_packet_crc", &c->last_packet_crc, UINT32_MAX, "2**32"},
             {"token_count", &c->token_count, UINT64_MAX, "2**64"},
             {"forward_count", &c->forward_count, UINT64_MAX, "2**64"}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!get(found, f[i].k, &v) || sj_kind(v) == 'z')
            continue; /* drops and forward_count may be left out (0); the rest are required */
        if (!sj_u64(v, f[i].dst) || *f[i].dst > f[i].max)
            return fail(why, whylen, "%s is %.*s%s, expected a non-negative integer below %s", f[i].k, SHOWN(v),
                        f[i].below);
    }
    get(found, "fingerprint", &v);
    if (!sj_str(v, c->fingerprint, sizeof c->fingerprint, &full) || !full)
        return fail(why, whylen, "fingerprint is %.*s%s, expected a string (of at most 1023 bytes)", SHOWN(v));
    if (get(found, "stream", &v) && sj_kind(v) != 'z' && (!sj_str(v, c->stream, sizeof c->stream, &full) || !full))
        return fail(why, whylen, "stream is %.*s%s, expected a string (of at most 4095 bytes)", SHOWN(v));
    if (get(found, "created", &v) && sj_kind(v) != 'z') {
        if (sj_kind(v) != '"')
            return fail(why, whylen, "created is %.*s%s, expected a string", SHOWN(v));
        c->created = v;
    }
    if (get(found, "token_log", &v) && sj_kind(v) != 'z') {
        sj_val t;
        uint64_t *dst[] = {&c->log_tokens, &c->log_bytes, &c->log_crc32c};
        static const char *const keys[] = {"tokens", "bytes", "crc32c"};
        if (sj_kind(v) != '{')
            return fail(why, whylen, "token_log is %.*s%s, expected {tokens, bytes, crc32c}", SHOWN(v));
        for (int i = 0; i < 3; i++)
            if (!sj_get(v, keys[i], &t) || !sj_u64(t, dst[i]))
                return fail(why, whylen, "token_log is %.*s%s: its %s is not a non-negative integer", SHOWN(v),
                            keys[i]);
        c->has_token_log = true;
    }
    if (sck_check(c, why, whylen))
        return -1;
    if (get(found, "tokens", &v) && sj_kind(v) == '[') {
        const char *it = v.p;
        sj_val e;
        c->tokens = v;
        c->listed_tokens = 0;
        while (sj_array_next(v, &it, &e))
            c->listed_tokens++;
    }
    return 0;
}

static void
u64_member(sw_buf *b, const char *name, uint64_t v)
{
    sw_lit(b, name);
    sw_u64(b, v);
}

int
sck_encode(sw_buf *b, const sck_checkpoint *c, const char *created, const sck_member *extra, size_t nextra,
           const sck_member *tokens, size_t ntokens, char *why, size_t whylen)
{
    if (sck_check(c, why, whylen))
        return -1;
    if (strlen(c->stream) >= sizeof c->stream || strlen(c->fingerprint) >= sizeof c->fingerprint)
        return fail(why, whylen, "stream or fingerprint too long");
    for (size_t i = 0; i < nextra; i++) {
        if (!sp_utf8_valid(extra[i].key, extra[i].key_len) || sck_format_key(extra[i].key, extra[i].key_len))
            return fail(why, whylen, "extra member \"%.*s\": a name of the format's own, or not UTF-8",
                        (int)(extra[i].key_len > 60 ? 60 : extra[i].key_len), extra[i].key);
        char err[96];
        if (!sj_validate(extra[i].json, extra[i].json_len, err, sizeof err))
            return fail(why, whylen, "extra member \"%.*s\" is not one JSON value: %s",
                        (int)(extra[i].key_len > 60 ? 60 : extra[i].key_len), extra[i].key, err);
    }
    sw_lit(b, "{\"format\":\"strap-checkpoint\",\"version\":1,\"stream\":");
    sw_str(b, c->stream, strlen(c->stream));
    sw_lit(b, ",\"created\":");
    sw_str(b, created, strlen(created));
    sw_lit(b, ",\"fingerprint\":");
    sw_str(b, c->fingerprint, strlen(c->fingerprint));
    u64_member(b, ",\"stream_offset\":", c->stream_offset);
    u64_member(b, ",\"packets\":", c->packets);
    u64_member(b, ",\"drops\":", c->drops);
    u64_member(b, ",\"last_seq\":", c->last_seq);
    u64_member(b, ",\"last_packet_offset\":", c->last_packet_offset);
    u64_member(b, ",\"last_packet_crc\":", c->last_packet_crc);
    u64_member(b, ",\"token_count\":", c->token_count);
    u64_member(b, ",\"forward_count\":", c->forward_count);
    if (c->has_token_log) {
        u64_member(b, ",\"token_log\":{\"tokens\":", c->log_tokens);
        u64_member(b, ",\"bytes\":", c->log_bytes);
        u64_member(b, ",\"crc32c\":", c->log_crc32c);
        sw_lit(b, "}");
    }
    for (size_t i = 0; i < nextra; i++) {
        sw_lit(b, ",");
        sw_str(b, extra[i].key, extra[i].key_len);
        sw_lit(b, ":");
        sw_raw(b, extra[i].json, extra[i].json_len);
    }
    if (tokens) {
        sw_lit(b, ",\"tokens\":[");
        for (size_t i = 0; i < ntokens; i++) {
            if (i)
                sw_lit(b, ",");
            sw_raw(b, tokens[i].json, tokens[i].json_len);
        }
        sw_lit(b, "]");
    }
    sw_lit(b, "}\n");
    if (b->overflow)
        return fail(why, whylen, "the checkpoint exceeds its buffer of %zu bytes", b->cap);
    return 0;
}

void
sck_rfc3339(char *out, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%06ldZ", ts.tv_nsec / 1000);
}

/* ----- durable files ----- */

static int sys_fail(char *why, size_t whylen, int err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* -err, with why set to the step (fmt) and the system's reason. */
static int
sys_fail(char *why, size_t whylen, int err, const char *fmt, ...)
{
    if (why && whylen) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < whylen)
            snprintf(why + n, whylen - (size_t)n, ": %s", strerror(err));
    }
    return -err;
}

/* Write all n bytes (EINTR retried): 0 or -errno. */
static int
write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int
sck_fsync_dir(const char *path, char *why, size_t whylen)
{
    char dir[SCK_PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof dir)
        return sys_fail(why, whylen, ENAMETOOLONG, "fsync of the directory of %.200s...", path);
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = 0;
    else if (slash)
        *slash = 0;
    else
        strcpy(dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return sys_fail(why, whylen, errno, "open of the directory %s", dir);
    int err = fsync(fd) != 0 ? errno : 0;
    close(fd);
    return err ? sys_fail(why, whylen, err, "fsync of the directory %s", dir) : 0;
}

int
sck_write_atomic(const char *path, const void *data, size_t n, int mode, char *why, size_t whylen)
{
    char tmp[SCK_PATH_MAX + 32];
    if (strlen(path) >= SCK_PATH_MAX)
        return sys_fail(why, whylen, ENAMETOOLONG, "open %.200s...", path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode_t)mode);
    if (fd < 0)
        return sys_fail(why, whylen, errno, "open %s", tmp);
    const char *step = "write";
    int r = write_all(fd, data, n);
    if (r == 0 && fsync(fd) != 0) {
        r = -errno;
        step = "fsync";
    }
    if (close(fd) != 0 && r == 0 && errno != EINTR) {
        r = -errno;
        step = "close";
    }
    if (r == 0 && rename(tmp, path) != 0) {
        r = -errno;
        unlink(tmp);
        return sys_fail(why, whylen, -r, "rename %s to %s", tmp, path);
    }
    if (r) {
        unlink(tmp);
        return sys_fail(why, whylen, -r, "%s %s", step, tmp);
    }
    return sck_fsync_dir(path, why, whylen);
}

int
sck_unlink_durable(const char *path, char *why, size_t whylen)
{
    if (unlink(path) != 0)
        return sys_fail(why, whylen, errno, "unlink %s", path);
    return sck_fsync_dir(path, why, whylen);
}

int
sck_append_sync(int fd, const char *name, const void *data, size_t n, char *why, size_t whylen)
{
    char fdname[32];
    if (name == NULL) {
        snprintf(fdname, sizeof fdname, "descriptor %d", fd);
        name = fdname;
    }
    int r = write_all(fd, data, n);
    if (r)
        return sys_fail(why, whylen, -r, "write to %s", name);
    if (fdatasync(fd) != 0)
        return sys_fail(why, whylen, errno, "fdatasync of %s", name);
    return 0;
}
