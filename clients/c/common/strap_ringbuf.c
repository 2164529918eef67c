/* The client's ring (strap_ringbuf.h). libstrap and the Python client's _speedups extension
 * both compile this file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "strap_ringbuf.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif

static int
fail(srb_ring *r, char *err, size_t errlen, const char *what)
{
    int e = errno;
    snprintf(err, errlen, "%s: %s", what, strerror(e));
    srb_destroy(r);
    errno = e;
    return -1;
}

int
srb_create(srb_ring *r, uint64_t ring_size, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    if (ring_size <= SR_HEADER_SIZE || (ring_size - SR_HEADER_SIZE) % 64 || ring_size > (uint64_t)SIZE_MAX) {
        snprintf(err, errlen, "ring_size %llu must be 4096 + a positive multiple of 64", (unsigned long long)ring_size);
        errno = EINVAL;
        return -1;
    }
    /* memfd_create and fcntl by their system calls: the libc wrappers (glibc 2.27; fcntl64,
     * 2.28, under the 64-bit file offsets Python.h asks for) are newer than the Python wheels'
     * glibc floor (2.17). */
    r->fd = (int)syscall(SYS_memfd_create, "strap-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r->fd < 0)
        return fail(r, err, errlen, "memfd_create");
    if (ftruncate(r->fd, (off_t)ring_size) != 0)
        return fail(r, err, errlen, "ftruncate ring");
    void *m = mmap(NULL, (size_t)ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (m == MAP_FAILED)
        return fail(r, err, errlen, "mmap ring");
    r->base = m;
    r->ring_size = ring_size;
    r->data_size = ring_size - SR_HEADER_SIZE;
    sr_encode_ring_header(r->base, ring_size);
    if (syscall(SYS_fcntl, r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return fail(r, err, errlen, "seal ring");
    return 0;
}

void
srb_close_fd(srb_ring *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

void
srb_destroy(srb_ring *r)
{
    if (r->base)
        munmap(r->base, (size_t)r->ring_size);
    r->base = NULL;
    srb_close_fd(r);
}

void
srb_reset(srb_ring *r)
{
    r->head = r->tail = 0;
    memset(r->base + SR_PUBLISHED_OFFSET, 0, 8);
}

void
srb_populate(srb_ring *r, uint64_t end)
{
    if (end <= r->populated)
        return;
    uint64_t start = r->populated;
    uint64_t stop = end > start + SRB_POPULATE_CHUNK ? end : start + SRB_POPULATE_CHUNK;
    if (stop > r->data_size)
        stop = r->data_size;
    uint64_t first = (SR_HEADER_SIZE + start) & ~(uint64_t)4095;
    if (madvise(r->base + first, (size_t)(SR_HEADER_SIZE + stop - first), MADV_POPULATE_WRITE) != 0)
        stop = r->data_size; /* not supported here: never try again */
    /* once the whole region is populated, no position (the head never wraps) asks again */
    r->populated = stop < r->data_size ? stop : UINT64_MAX;
}

void
srb_place(srb_ring *r, uint64_t pad, uint64_t rec_len)
{
    if (pad) {
        srb_populate(r, r->head + pad);
        /* A PAD may be a single 64-byte slot at the very end of the region: sr_encode_pad
         * writes no more than pad bytes (strapd reads only magic, kind and record_len). */
        sr_encode_pad(srb_at(r, r->head), pad);
        r->head += pad;
    }
    srb_populate(r, r->head + rec_len);
}

int
srb_release(srb_ring *r, uint64_t tail, char *err, size_t errlen)
{
    if (tail > r->head) {
        snprintf(err, errlen,
                 "strapd released the ring up to %llu, past the head %llu the client published (a RELEASE may "
                 "not pass the head, PROTOCOL.md 3)",
                 (unsigned long long)tail, (unsigned long long)r->head);
        return -1;
    }
    /* Accepting it would leave the tail where the daemon says it has not read yet: the writer
     * then waits for space that never comes and times out, far from the cause. */
    if (tail < r->tail) {
        snprintf(err, errlen,
                 "strapd moved the ring's tail backwards, from %llu to %llu (tails only grow, PROTOCOL.md 3)",
                 (unsigned long long)r->tail, (unsigned long long)tail);
        return -1;
    }
    /* The daemon finished reading these bytes before it sent RELEASE (PROTOCOL.md 3); later
     * writes into them must not be hoisted above the receive. */
    atomic_thread_fence(memory_order_acquire);
    r->tail = tail;
    return 0;
}

void
srb_store_published(srb_ring *r, uint64_t pos)
{
    /* The ring's base is page aligned, so the u64 at offset 32 is naturally aligned. */
    atomic_store_explicit((_Atomic uint64_t *)(void *)(r->base + SR_PUBLISHED_OFFSET), pos, memory_order_release);
}

bool
srb_put_token(srb_ring *r, uint64_t seq, uint64_t index, int64_t token_id, int64_t position, const char *text,
              size_t text_len)
{
    uint64_t rec_len = sr_token_record_len(text_len);
    uint64_t pad = srb_pad_for(r, rec_len);
    if (!srb_fits(r, pad + rec_len))
        return false;
    srb_place(r, pad, rec_len);
    sr_encode_token_record(srb_at(r, r->head), seq, index, token_id, position, text, text_len);
    r->head += rec_len;
    return true;
}
