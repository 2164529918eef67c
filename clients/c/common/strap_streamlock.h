/*
 * The stream lock of docs/CHECKPOINTS.md 5, written once for the client side: one live
 * capture per stream file. libstrap (src/streamlock.c) and the Python client's extension
 * (_speedups.c, behind _streamlock.py) both lock with it.
 *
 * A capture takes flock(LOCK_EX) on its stream's open file description before it changes a
 * byte of the file. Who holds a taken lock decides (the holder is the pid /proc/locks shows,
 * the process that took it):
 *
 * - a live process, or a capture of this process still marked live (stl_mark_live until
 *   stl_mark_ended): a capture still writing. stl_lock fails at once, naming the file and
 *   the pid; waiting would only let this capture empty the other's finished stream (issue 25).
 *   A holder /proc/locks does not show is taken to be alive.
 * - a process that is gone (exited or killed; a zombie counts as gone), or this process with
 *   no capture of the file marked live: its strapd session is still being ended, so the lock
 *   is waited for, up to a deadline.
 *
 * Header-only (static: no symbol a host program could clash with), but it holds this
 * process's registry of live captures: include it from one translation unit of a program.
 * Plain C99 + POSIX; no sscanf or strtol (nothing newer than glibc 2.17 for the wheels).
 */
#ifndef STRAP_STREAMLOCK_H
#define STRAP_STREAMLOCK_H

/* flock, kill, O_CLOEXEC, clock_gettime: the includer defines _GNU_SOURCE (Python.h does)
 * before its first system header. */
#if !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#error "strap_streamlock.h needs _GNU_SOURCE (or _DEFAULT_SOURCE) defined before any system header"
#endif

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

enum {
    STL_LOCKED = 0,      /* the lock is ours */
    STL_LIVE_HERE = 1,   /* a capture of this process marked live holds it */
    STL_LIVE = 2,        /* a live process holds it */
    STL_UNKNOWN = 3,     /* held, and /proc/locks names no holder: taken to be alive */
    STL_TIMEOUT = 4,     /* a gone holder's lock still held at the deadline */
    STL_INTERRUPTED = 5, /* the caller's interrupted() asked to stop waiting */
    STL_ERROR = 6,       /* flock failed (or out of memory): err */
    STL_MSG_MAX = 2 * 4096 + 512,
};

/* What stl_lock found. */
typedef struct stl_result {
    int verdict; /* STL_* */
    pid_t pid;   /* the holder (0: not found) */
    int err;     /* errno, for STL_ERROR */
    dev_t dev;   /* the file (set once fstat succeeded) */
    ino_t ino;
    char msg[STL_MSG_MAX]; /* the sentence to report ("" for STL_LOCKED, STL_INTERRUPTED) */
} stl_result;

/* ----- this process's live captures, by stream file -------------------------------------- */

typedef struct stl_live_entry {
    dev_t dev;
    ino_t ino;
    char *path;
} stl_live_entry;

static pthread_mutex_t stl_live_mu = PTHREAD_MUTEX_INITIALIZER;
static stl_live_entry *stl_live_tab;
static size_t stl_live_n, stl_live_cap;

/* Mark the capture of (dev, ino), writing path, as this process's live one (replacing an
 * earlier mark of the file). 0, or -1 when out of memory (nothing marked). */
static inline int
stl_mark_live(dev_t dev, ino_t ino, const char *path)
{
    size_t n = strlen(path);
    char *copy = malloc(n + 1);
    if (!copy)
        return -1;
    memcpy(copy, path, n + 1);
    int rc = 0;
    pthread_mutex_lock(&stl_live_mu);
    size_t i = 0;
    while (i < stl_live_n && !(stl_live_tab[i].dev == dev && stl_live_tab[i].ino == ino))
        i++;
    if (i < stl_live_n) {
        free(stl_live_tab[i].path);
        stl_live_tab[i].path = copy;
    } else {
        if (stl_live_n == stl_live_cap) {
            size_t cap = stl_live_cap ? 2 * stl_live_cap : 8;
            stl_live_entry *t = realloc(stl_live_tab, cap * sizeof *t);
            if (t) {
                stl_live_tab = t;
                stl_live_cap = cap;
            }
        }
        if (stl_live_n < stl_live_cap)
            stl_live_tab[stl_live_n++] = (stl_live_entry){dev, ino, copy};
        else
            rc = -1;
    }
    pthread_mutex_unlock(&stl_live_mu);
    if (rc)
        free(copy);
    return rc;
}

/* The capture of (dev, ino) has stopped or aborted (its lock may outlive it for a while, in
 * strapd's copy of the descriptor). No mark: nothing happens. */
static inline void
stl_mark_ended(dev_t dev, ino_t ino)
{
    pthread_mutex_lock(&stl_live_mu);
    for (size_t i = 0; i < stl_live_n; i++) {
        if (stl_live_tab[i].dev == dev && stl_live_tab[i].ino == ino) {
            free(stl_live_tab[i].path);
            stl_live_tab[i] = stl_live_tab[--stl_live_n];
            break;
        }
    }
    pthread_mutex_unlock(&stl_live_mu);
}

/* Whether a capture of (dev, ino) is marked live; its path into buf (when buf). */
static inline bool
stl_live_path(dev_t dev, ino_t ino, char *buf, size_t len)
{
    bool found = false;
    pthread_mutex_lock(&stl_live_mu);
    for (size_t i = 0; i < stl_live_n && !found; i++) {
        if (stl_live_tab[i].dev == dev && stl_live_tab[i].ino == ino) {
            found = true;
            if (buf && len)
                snprintf(buf, len, "%s", stl_live_tab[i].path);
        }
    }
    pthread_mutex_unlock(&stl_live_mu);
    return found;
}

/* ----- the holder, from /proc/locks ------------------------------------------------------ */

/* The next whitespace-separated field of [*p, end) into (*f, *fn); false at the line's end. */
static inline bool
stl_field(const char **p, const char *end, const char **f, size_t *fn)
{
    const char *s = *p;
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    const char *e = s;
    while (e < end && *e != ' ' && *e != '\t')
        e++;
    *f = s;
    *fn = (size_t)(e - s);
    *p = e;
    return e > s;
}

static inline bool
stl_is(const char *f, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(f, want, n) == 0;
}

/*
 * The pid that holds the flock(LOCK_EX) on the file (major, minor, ino), from the text of
 * /proc/locks (text[0..n)); 0 when none is found. A line reads
 * "12: FLOCK  ADVISORY  WRITE 4321 00:2a:98765 0 EOF" (waiters have "->" before FLOCK, and
 * are skipped). An entry whose device matches names the holder; without one, the inode alone
 * does (a file system whose device /proc/locks shows differently from stat), when exactly one
 * pid holds it. Two different pids for the file name none.
 */
static inline pid_t
stl_holder_in(const char *text, size_t n, unsigned maj, unsigned min, uint64_t ino)
{
    char want[64], inos[32];
    int wn = snprintf(want, sizeof want, "%02x:%02x:%llu", maj, min, (unsigned long long)ino);
    int in = snprintf(inos, sizeof inos, "%llu", (unsigned long long)ino);
    pid_t exact = 0, by_ino = 0;
    bool exact_many = false, ino_many = false;
    const char *p = text, *end = text + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *q = p;
        p = nl ? nl + 1 : end;
        const char *f[6];
        size_t fn[6];
        int k = 0;
        while (k < 6 && stl_field(&q, le, &f[k], &fn[k]))
            k++;
        if (k < 6 || !stl_is(f[1], fn[1], "FLOCK") || !stl_is(f[3], fn[3], "WRITE"))
            continue;
        long long pid = 0;
        size_t i = 0;
        while (i < fn[4] && f[4][i] >= '0' && f[4][i] <= '9' && pid <= INT32_MAX)
            pid = pid * 10 + (f[4][i++] - '0');
        if (i != fn[4] || pid <= 0 || pid > INT32_MAX)
            continue;
        if (fn[5] == (size_t)wn && memcmp(f[5], want, (size_t)wn) == 0) {
            exact_many |= exact != 0 && exact != (pid_t)pid;
            exact = (pid_t)pid;
            continue;
        }
        const char *c = f[5] + fn[5];
        while (c > f[5] && c[-1] != ':')
            c--;
        if (c > f[5] && (size_t)(f[5] + fn[5] - c) == (size_t)in && memcmp(c, inos, (size_t)in) == 0) {
            ino_many |= by_ino != 0 && by_ino != (pid_t)pid;
            by_ino = (pid_t)pid;
        }
    }
    if (exact)
        return exact_many ? 0 : exact;
    return ino_many ? 0 : by_ino;
}

/* stl_holder_in over the file locks_file (NULL: /proc/locks); 0 when it cannot be read. */
static inline pid_t
stl_holder(dev_t dev, ino_t ino, const char *locks_file)
{
    int fd = open(locks_file ? locks_file : "/proc/locks", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t cap = 16384, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            char *b = cap < ((size_t)64 << 20) ? realloc(buf, cap * 2) : NULL;
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r < 0) {
                free(buf);
                buf = NULL;
            }
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    if (!buf)
        return 0;
    pid_t pid = stl_holder_in(buf, n, major(dev), minor(dev), (uint64_t)ino);
    free(buf);
    return pid;
}

/* Whether pid runs (a zombie does not: a killed client not yet reaped). */
static inline bool
stl_alive(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true; /* another user's process, or no /proc: alive */
    ssize_t n;
    do
        n = read(fd, buf, sizeof buf - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return true;
    /* "pid (comm) S ...": the state follows the last ')' */
    const char *c = NULL;
    for (ssize_t i = 0; i < n; i++)
        c = buf[i] == ')' ? buf + i : c;
    return !(c && c + 2 < buf + n && c[1] == ' ' && (c[2] == 'Z' || c[2] == 'X'));
}

/* ----- taking the lock ------------------------------------------------------------------- */

static inline double
stl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The message of a live holder (verdict STL_LIVE_HERE, STL_LIVE or STL_UNKNOWN). */
static inline void
stl_in_use_message(stl_result *r, const char *path, const char *live)
{
    char who[4096 + 128];
    if (r->verdict == STL_LIVE_HERE)
        snprintf(who, sizeof who, "a capture in this process (pid %d) that has not stopped, writing '%s'", (int)r->pid,
                 live);
    else if (r->verdict == STL_LIVE)
        snprintf(who, sizeof who, "a live capture of process %d", (int)r->pid);
    else
        snprintf(who, sizeof who, "a live capture whose process could not be found in /proc/locks");
    snprintf(r->msg, sizeof r->msg,
             "%s is being written by %s: a second capture of the same file would destroy that stream, so nothing "
             "was changed in it. Give this capture another output_path (every rank of a distributed job needs its "
             "own), or stop the other capture first",
             path, who);
}

/*
 * Take the exclusive flock on fd, the stream path names (for messages), its file (dev, ino)
 * as fstat gives them (the caller's fstat: glibc 2.33 made fstat a symbol of its own, newer
 * than the wheels may need); nothing in the file is changed. A live holder fails at once; a gone one is waited for up to wait_s seconds,
 * polling every 50 ms. locks_file: NULL for /proc/locks. interrupted (may be NULL) is asked
 * between polls, with ctx; nonzero stops the wait (STL_INTERRUPTED). mark: when not NULL, the
 * lock, once taken, is marked live with this path (stl_mark_live) in the same step, so that
 * no other thread of this process sees it held and unmarked; out of memory then gives
 * STL_ERROR with ENOMEM (the lock is released). flock failing otherwise: STL_ERROR, errno in
 * r->err.
 *
 * Returns r->verdict, with r->pid, r->err and r->msg filled.
 */
static inline int
stl_lock(int fd, dev_t dev, ino_t ino, const char *path, double wait_s, const char *locks_file, const char *mark,
         int (*interrupted)(void *), void *ctx, stl_result *r)
{
    r->verdict = STL_LOCKED;
    r->pid = 0;
    r->err = 0;
    r->msg[0] = 0;
    double deadline = stl_now() + wait_s;
    char live[4096];
    for (;;) {
        int rc = flock(fd, LOCK_EX | LOCK_NB);
        if (rc != 0 && errno == EINTR)
            continue;
        if (rc != 0 && errno != EWOULDBLOCK) {
            r->err = errno;
            r->verdict = STL_ERROR;
            snprintf(r->msg, sizeof r->msg, "flock %s: %s", path, strerror(r->err));
            return r->verdict;
        }
        pid_t pid = 0;
        if (rc != 0) {
            pid = stl_holder(dev, ino, locks_file);
            /* none found: released between the two calls, or not to be found; one retry tells */
            if (pid == 0 && (rc = flock(fd, LOCK_EX | LOCK_NB)) != 0)
                pid = stl_holder(dev, ino, locks_file);
        }
        if (rc == 0) {
            if (mark && stl_mark_live(dev, ino, mark) != 0) {
                flock(fd, LOCK_UN);
                r->err = ENOMEM;
                r->verdict = STL_ERROR;
                snprintf(r->msg, sizeof r->msg, "%s: out of memory marking the capture live", path);
            }
            return r->verdict;
        }
        r->pid = pid;
        if (pid == getpid())
            r->verdict = stl_live_path(dev, ino, live, sizeof live) ? STL_LIVE_HERE : STL_LOCKED;
        else if (pid == 0)
            r->verdict = STL_UNKNOWN;
        else
            r->verdict = stl_alive(pid) ? STL_LIVE : STL_LOCKED;
        if (r->verdict != STL_LOCKED) {
            stl_in_use_message(r, path, live);
            return r->verdict;
        }
        /* a gone holder (or this process's stopped capture): its strapd session is ending */
        if (stl_now() >= deadline) {
            r->verdict = STL_TIMEOUT;
            snprintf(r->msg, sizeof r->msg,
                     "%s is in use by a capture that has ended (process %d), but its strapd session still holds "
                     "the stream lock after %.0fs",
                     path, (int)pid, wait_s);
            return r->verdict;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (interrupted && interrupted(ctx)) {
            r->verdict = STL_INTERRUPTED;
            return r->verdict;
        }
    }
}

#endif
