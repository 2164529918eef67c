/*
 * The client's ring (docs/PROTOCOL.md 2), written once for the client side: the sealed memfd
 * and its mapping, the head the client writes at and the tail strapd released, the PAD that
 * ends the region, the pages populated ahead of the first lap, a RELEASE's checks and the
 * published cursor's release store. libstrap's sessions (src/open.c, src/session.c) and the
 * Python client's extension (_speedups_ring.c, behind _ring.py and _session.py) both keep
 * their ring with it; the record layout itself is strap_ring.h.
 *
 * Positions only grow; position p lives at file offset SR_HEADER_SIZE + p % data_size.
 * Records start and end on 64-byte boundaries and never wrap (a PAD fills the end of the
 * region instead). Nothing here sends or locks: the caller holds its session's lock.
 */
#ifndef STRAP_RINGBUF_H
#define STRAP_RINGBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strap_ring.h"

/* Internal symbols carry libstrap's prefix: a static libstrap.a shares one namespace with its
 * host program. */
#define srb_create strap__srb_create
#define srb_close_fd strap__srb_close_fd
#define srb_destroy strap__srb_destroy
#define srb_reset strap__srb_reset
#define srb_populate strap__srb_populate
#define srb_place strap__srb_place
#define srb_release strap__srb_release
#define srb_store_published strap__srb_store_published
#define srb_put_token strap__srb_put_token

enum {
    /* On the ring's first lap its pages are populated this far ahead of the head at a time:
     * one madvise for 1024 pages costs less than 1024 page faults taken inside the copies. */
    SRB_POPULATE_CHUNK = 4 << 20,
};

/* A ring. Zeroed with fd -1 and base NULL it holds nothing (srb_destroy is a no-op). */
typedef struct srb_ring {
    int fd;        /* the memfd sent in OPEN; -1 once closed */
    uint8_t *base; /* the mapping of ring_size bytes, NULL when unmapped */
    uint64_t ring_size, data_size;
    uint64_t head;      /* next write position: bytes written since the start, never wraps */
    uint64_t tail;      /* the newest position strapd released */
    uint64_t populated; /* data bytes from the start populated (UINT64_MAX: all of them) */
} srb_ring;

/* Make a ring of ring_size bytes (SR_HEADER_SIZE + a positive multiple of 64): a memfd sized,
 * mapped shared read-write, its RingHeader written and sealed against shrinking and growing
 * (strapd refuses a ring without the shrink seal: a truncate could SIGBUS it). 0, or -1 with
 * the reason in err (r then holds nothing; errno is the failed call's, EINVAL for a bad
 * size). */
int srb_create(srb_ring *r, uint64_t ring_size, char *err, size_t errlen);
/* Close the memfd only (the mapping stays until srb_destroy): the Python client's views of the
 * mapping may outlive its close. */
void srb_close_fd(srb_ring *r);
/* Unmap and close (idempotent). */
void srb_destroy(srb_ring *r);
/* Start again at position 0 for a new session: the pages stay populated, the old records stay
 * in them until overwritten (the daemon reads only what the new session publishes), and the
 * published cursor goes back to 0 (the header's reserved bytes must be zero at OPEN). */
void srb_reset(srb_ring *r);
/* Populate the pages up to data position end (and a chunk beyond) before the first lap writes
 * there. Only a speed-up: where the kernel cannot, the writes fault the pages in themselves. */
void srb_populate(srb_ring *r, uint64_t end);
/* The head made ready for a record of rec_len bytes: the PAD of pad bytes (srb_pad_for) that
 * ends the region written first and the head moved past it, the pages populated. The caller
 * made the space free (srb_fits). */
void srb_place(srb_ring *r, uint64_t pad, uint64_t rec_len);
/* Apply a RELEASE: tails only grow and never pass the head (PROTOCOL.md 3). 0, or -1 with the
 * protocol error in err (the tail unchanged). */
int srb_release(srb_ring *r, uint64_t tail, char *err, size_t errlen);
/* Store the published cursor (PROTOCOL.md 1.4, "Deferred PUBLISH") with release semantics:
 * every record below pos is complete before a daemon that loads it (acquire) can see it. */
void srb_store_published(srb_ring *r, uint64_t pos);

/* Write a TOKEN record (PROTOCOL.md 2, "TOKEN records") of sequence number seq at the head, a
 * PAD first where the region ends too soon, and move the head past it: the token's index, its
 * id and position, its UTF-8 text (at most SR_MAX_TOKEN_TEXT bytes, checked by the caller).
 * False, writing nothing, when it does not fit the space known to be free now (a token never
 * waits for ring space: the caller drains RELEASEs and tries again, or sends a TOKEN message). */
bool srb_put_token(srb_ring *r, uint64_t seq, uint64_t index, int64_t token_id, int64_t position, const char *text,
                   size_t text_len);

/* Bytes written but not yet released. */
static inline uint64_t
srb_used(const srb_ring *r)
{
    return r->head - r->tail;
}

/* Whether needed bytes can be written now without overwriting unreleased data. */
static inline bool
srb_fits(const srb_ring *r, uint64_t needed)
{
    return r->head - r->tail + needed <= r->data_size;
}

/* The PAD a record of rec_len bytes at the head needs first: 0 when it fits before the end of
 * the region, else the rest of the region. */
static inline uint64_t
srb_pad_for(const srb_ring *r, uint64_t rec_len)
{
    uint64_t off = r->head % r->data_size;
    return off + rec_len > r->data_size ? r->data_size - off : 0;
}

/* The address of position pos in the mapping. */
static inline uint8_t *
srb_at(const srb_ring *r, uint64_t pos)
{
    return r->base + SR_HEADER_SIZE + pos % r->data_size;
}

/* The common case of a record of rec_len bytes, with nothing to do first: it fits before the
 * end of the region, in space known to be free, in pages already populated. */
static inline bool
srb_ready(const srb_ring *r, uint64_t rec_len)
{
    return r->head % r->data_size + rec_len <= r->data_size && r->head + rec_len - r->tail <= r->data_size &&
           r->head + rec_len <= r->populated;
}

#endif
