/*
 * Connecting to strapd, written once for the client side (docs/PROTOCOL.md 1): connect to the
 * control socket; when nobody answers and autostart is on, start a detached
 * `strapd serve --socket PATH` — one process at a time, under an flock on PATH.lock beside
 * the socket — and wait until it accepts. libstrap (src/conn.c) and the Python client's
 * extension (_speedups.c, behind _daemon.py) both connect with it.
 *
 * Of the processes that find no daemon at once, the one holding the lock starts it and keeps
 * the lock until it accepts (or fails); the others connect as soon as it answers. Whoever
 * takes the lock tries to connect again first, so a daemon started meanwhile is used, never
 * doubled. A stale socket file is left to the new daemon, which replaces it.
 *
 * The daemon is started by a double fork, so it never becomes the host's zombie; the middle
 * process stays until the start is over and reports the daemon's exit status if it exits
 * first: a daemon exiting 0 at start-up found another one serving on the socket (the client
 * then keeps trying to connect until its timeout); any other status is a failed start, told
 * at once with the tail of the daemon's log.
 *
 * Header-only (static: no symbol a host program could clash with). The child processes call
 * only async-signal-safe functions between fork and exec/_exit (the host may have threads).
 * Plain C99 + POSIX + Linux; nothing newer than glibc 2.17 (the Python wheels' floor).
 */
#ifndef STRAP_CONNECT_H
#define STRAP_CONNECT_H

/* pipe2, O_CLOEXEC, SOCK_CLOEXEC: the includer defines _GNU_SOURCE (Python.h does) before
 * its first system header. */
#if !defined(_GNU_SOURCE)
#error "strap_connect.h needs _GNU_SOURCE defined before any system header"
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How to connect (what differs between the clients is only the advice in messages). */
typedef struct sk_options {
    const char *binary;         /* the strapd to start; NULL: $STRAPD_BIN, then strapd on PATH */
    double timeout;             /* seconds for a started daemon to accept (<= 0: 10) */
    double lock_timeout;        /* seconds to wait for another process's start (< 0: 3 x timeout) */
    const char *autostart_hint; /* how to turn autostart on, e.g. "set params.autostart" */
    const char *socket_hint;    /* what names the socket, e.g. "STRAPD_SOCKET or params.socket_path" */
    const char *binary_hint;    /* where a strapd binary comes from, e.g. "set STRAPD_BIN, put strapd on PATH" */
    /* Called between the polls of a wait (NULL: never); nonzero stops the connect, which
     * returns SK_INTERRUPTED (a Python client runs its signal handlers here). */
    int (*interrupted)(void *arg);
    void *interrupt_arg;
} sk_options;

/* sk_connect's return when options.interrupted asked it to stop. */
#define SK_INTERRUPTED (-2)

/* What a connect did. */
typedef struct sk_result {
    int started_pid; /* the daemon this call started, 0 when it started none */
    char log[4200];  /* that daemon's log (strapd.log beside the socket) */
    char msg[8192];  /* why the connect failed */
} sk_result;

/* s, or d where the caller left s NULL */
static const char *
sk_or(const char *s, const char *d)
{
    return s ? s : d;
}

/* r->msg from a format, truncated to fit (a long log tail is cut, not an error). */
static void sk_fail(sk_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void
sk_fail(sk_result *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
}

static double
sk_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
sk_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Connect to the socket at path: the descriptor (close-on-exec), or -errno. */
static int
sk_try_connect(const char *path)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path)
        return -ENAMETOOLONG;
    strcpy(a.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    while (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        close(fd);
        return -e;
    }
    return fd;
}

/* An executable file the daemon can be: executable by us, not a directory, and not the console
 * script pip writes for `strapd`, which runs the Python client's finder (finding it must not
 * count as finding the daemon). No stat(): with the 64-bit file offsets Python.h asks for it
 * binds stat64@GLIBC_2.33, newer than the wheels' floor; opening and reading the head tells a
 * directory (EISDIR) apart as well. */
static bool
sk_executable(const char *path)
{
    char head[1024];
    if (access(path, X_OK) != 0)
        return false;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, head, sizeof head - 1);
    close(fd);
    if (n < 0)
        return errno != EISDIR;
    head[n] = 0;
    return !(n >= 2 && head[0] == '#' && head[1] == '!' && strstr(head, "llm_instrumentation._strapd_cli"));
}

/* binary, else $STRAPD_BIN, else `strapd` on PATH (the shim skipped). out holds the candidate
 * even when it is not executable (for the message), "" when there was none. */
static bool
sk_find_binary(const char *given, char *out, size_t cap)
{
    const char *env = getenv("STRAPD_BIN");
    const char *first = given && *given ? given : (env && *env ? env : NULL);
    if (first) {
        snprintf(out, cap, "%s", first);
        return access(first, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        snprintf(out, cap, "%.*s/strapd", (int)n, n ? path : ".");
        if (sk_executable(out))
            return true;
        path += n + (c ? 1 : 0);
    }
    out[0] = 0;
    return false;
}

/* The last cap-1 bytes of the log, or "(no log)". */
static void
sk_log_tail(const char *log, char *out, size_t cap)
{
    out[0] = 0;
    int fd = open(log, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(out, cap, "(no log)");
        return;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    off_t from = size > (off_t)(cap - 1) ? size - (off_t)(cap - 1) : 0;
    ssize_t n = pread(fd, out, cap - 1, from);
    close(fd);
    out[n > 0 ? n : 0] = 0;
}

/* mkdir -p with mode 0700 for the parts it creates. */
static int
sk_mkdirs(char *dir)
{
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        int r = mkdir(dir, 0700);
        *p = '/';
        if (r != 0 && errno != EEXIST)
            return -1;
    }
    return mkdir(dir, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

/* An environment switch: set, and neither empty nor "0". */
static bool
sk_env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* The directory of a path ("." for a bare name) into dir. */
static void
sk_dirname(const char *path, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir)
        *slash = 0;
    else if (!slash)
        snprintf(dir, cap, ".");
}

/* A started daemon: its pid, and the middle process that watches its start. */
typedef struct sk_spawned {
    pid_t pid;
    pid_t middle;
    int report; /* read end: the middle process's report of the daemon's exit */
    int go;     /* write end: closed when the start is over, the middle process leaves */
} sk_spawned;

/* Messages on the report pipe: two int32 each. */
enum { SK_PID = 1, SK_EXITED = 2, SK_EXEC_FAILED = 3 };

static void
sk_put(int fd, int32_t kind, int32_t v)
{
    int32_t m[2] = {kind, v};
    ssize_t w;
    do
        w = write(fd, m, sizeof m);
    while (w < 0 && errno == EINTR);
}

/* The middle process: start the daemon, report its pid, then report its exit (status, or the
 * exec's errno) if it exits before the parent closes `go`; leave when it does. Only
 * async-signal-safe calls. */
static void
sk_middle(const char *bin, char *const argv[], int logfd, int report, int go)
{
    int ex[2];
    signal(SIGCHLD, SIG_DFL); /* a host ignoring SIGCHLD would have the daemon's status thrown away */
    if (pipe2(ex, O_CLOEXEC) != 0)
        _exit(1);
    pid_t g = fork();
    if (g < 0)
        _exit(1);
    if (g == 0) {
        setsid();
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        /* the exec-error pipe becomes fd 3 (closed by exec); every other descriptor of the
         * host process stays out of the daemon */
        if (ex[1] != 3)
            dup2(ex[1], 3);
        /* the system call itself: fcntl() binds fcntl64@GLIBC_2.28 under 64-bit offsets */
        syscall(SYS_fcntl, 3, F_SETFD, FD_CLOEXEC);
#ifdef SYS_close_range
        if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
#endif
        {
            for (int fd = 4; fd < 65536; fd++)
                close(fd);
        }
        signal(SIGPIPE, SIG_DFL);
        execv(bin, argv);
        int32_t e = errno;
        ssize_t w = write(3, &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(ex[1]);
    close(logfd);
    sk_put(report, SK_PID, (int32_t)g);
    for (;;) {
        int st;
        pid_t r = waitpid(g, &st, WNOHANG);
        if (r == g) {
            int32_t e = 0;
            if (read(ex[0], &e, sizeof e) == (ssize_t)sizeof e)
                sk_put(report, SK_EXEC_FAILED, e);
            else
                sk_put(report, SK_EXITED, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            _exit(0);
        }
        struct pollfd p = {go, POLLIN, 0};
        if (poll(&p, 1, 20) > 0)
            _exit(0); /* the parent closed go: the start is over, the daemon goes on alone */
    }
}

/* Start `bin serve --socket sock --exit-idle ...` (its log beside the socket). 0 with *sp
 * filled, or -1 with msg set. */
static int
sk_spawn(const char *bin, const char *sock, char *log, size_t logcap, sk_spawned *sp, char *msg, size_t msgcap)
{
    char dir[4096]; /* + "/strapd.log" fits sk_result.log */
    sk_dirname(sock, dir, sizeof dir);
    if (snprintf(log, logcap, "%s/strapd.log", dir) >= (int)logcap) {
        snprintf(msg, msgcap, "the socket path %s is too long for its log's path", sock);
        return -1;
    }
    const char *idle = getenv("STRAPD_EXIT_IDLE");
    char *argv[9] = {(char *)bin,  (char *)"serve",       (char *)"--socket",
                     (char *)sock, (char *)"--exit-idle", (char *)(idle && *idle ? idle : "15m")};
    int argc = 6;
    if (sk_env_on("STRAPD_SCHED_IDLE"))
        argv[argc++] = (char *)"--sched-idle"; /* the model's threads preempt the daemon (DEPLOY.md) */
    if (sk_env_on("STRAPD_IDLE_WORKERS"))
        argv[argc++] = (char *)"--idle-workers"; /* only the compression workers (DEPLOY.md) */
    argv[argc] = NULL;
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        snprintf(msg, msgcap, "cannot open the daemon log %s: %s", log, strerror(errno));
        return -1;
    }
    int rep[2], go[2];
    if (pipe2(rep, O_CLOEXEC) != 0) {
        snprintf(msg, msgcap, "pipe2: %s", strerror(errno));
        close(logfd);
        return -1;
    }
    if (pipe2(go, O_CLOEXEC) != 0) {
        snprintf(msg, msgcap, "pipe2: %s", strerror(errno));
        close(logfd), close(rep[0]), close(rep[1]);
        return -1;
    }
    pid_t m = fork();
    if (m < 0) {
        snprintf(msg, msgcap, "fork: %s", strerror(errno));
        close(logfd), close(rep[0]), close(rep[1]), close(go[0]), close(go[1]);
        return -1;
    }
    if (m == 0) {
        close(rep[0]);
        close(go[1]);
        sk_middle(bin, argv, logfd, rep[1], go[0]);
        _exit(0);
    }
    close(logfd), close(rep[1]), close(go[0]);
    int32_t v[2] = {0, 0};
    ssize_t got = 0, r;
    while (got < (ssize_t)sizeof v && (r = read(rep[0], (char *)v + got, sizeof v - (size_t)got)) != 0) {
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        got += r;
    }
    if (got < (ssize_t)sizeof v || v[0] != SK_PID) {
        close(rep[0]), close(go[1]);
        while (waitpid(m, NULL, 0) < 0 && errno == EINTR)
            ;
        snprintf(msg, msgcap, "could not start %s (fork of the daemon failed)", bin);
        return -1;
    }
    syscall(SYS_fcntl, rep[0], F_SETFL, O_NONBLOCK);
    sp->pid = (pid_t)v[1];
    sp->middle = m;
    sp->report = rep[0];
    sp->go = go[1];
    return 0;
}

/* The start is over: the middle process leaves (reaped here), the daemon goes on alone. */
static void
sk_release(sk_spawned *sp)
{
    close(sp->go);
    close(sp->report);
    while (waitpid(sp->middle, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* With the lock held and still nobody answering: start the daemon and wait until it accepts.
 * The descriptor, or -1 with r->msg set. */
static int
sk_start_and_wait(const char *path, const sk_options *o, double timeout, sk_result *r)
{
    char bin[4200];
    if (!sk_find_binary(o->binary, bin, sizeof bin)) {
        sk_fail(r, "no strapd answers on %s and no strapd binary was found%s%s (%s)", path,
                bin[0] ? ": not executable: " : "", bin,
                sk_or(o->binary_hint, "set STRAPD_BIN, put strapd on PATH, or start `strapd serve` yourself"));
        return -1;
    }
    sk_spawned sp;
    if (sk_spawn(bin, path, r->log, sizeof r->log, &sp, r->msg, sizeof r->msg) != 0)
        return -1;
    r->started_pid = (int)sp.pid;
    double deadline = sk_now() + timeout;
    int status = -1; /* the daemon's exit status once the middle process told it */
    char tail[2001];
    for (;;) {
        int fd = sk_try_connect(path);
        if (fd >= 0) {
            sk_release(&sp);
            return fd;
        }
        int32_t m[2];
        ssize_t n;
        while ((n = read(sp.report, m, sizeof m)) == (ssize_t)sizeof m) {
            if (m[0] == SK_EXEC_FAILED) {
                sk_release(&sp);
                sk_fail(r, "could not start %s: exec: %s", bin, strerror(m[1]));
                return -1;
            }
            if (m[0] == SK_EXITED)
                status = m[1];
        }
        if (status > 0) {
            sk_release(&sp);
            sk_log_tail(r->log, tail, sizeof tail);
            sk_fail(r,
                    "strapd (pid %d) exited at start-up with status %d; log %s:\n%s\n(fix what the log says; run "
                    "`%s serve --socket %s` to see it happen; or point STRAPD_BIN at a working strapd)",
                    (int)sp.pid, status, r->log, tail, bin, path);
            return -1;
        }
        if (sk_now() > deadline) {
            sk_release(&sp);
            sk_log_tail(r->log, tail, sizeof tail);
            char what[512];
            if (status == 0)
                snprintf(what, sizeof what,
                         "strapd (pid %d) exited with status 0, reporting another strapd on the socket, but "
                         "nothing answers on %s",
                         (int)sp.pid, path);
            else
                snprintf(what, sizeof what, "strapd (pid %d) did not accept connections on %s", (int)sp.pid, path);
            sk_fail(r,
                    "%s within %.0fs; log %s:\n%s\n(check `strapd status --socket %s`; start `strapd serve "
                    "--socket %s` yourself; or set STRAPD_SOCKET to another path)",
                    what, timeout, r->log, tail, path, path);
            return -1;
        }
        if (o->interrupted && o->interrupted(o->interrupt_arg)) {
            sk_release(&sp);
            sk_fail(r, "interrupted while strapd (pid %d) started", (int)sp.pid);
            return SK_INTERRUPTED;
        }
        sk_sleep_ms(50);
    }
}

/* Open the autostart lock: read-write so its holder can write its pid, read-only when the
 * file is another user's in a shared socket directory (flock needs no more). */
static int
sk_open_lock(const char *lock, const char *sock, sk_result *r)
{
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EACCES)
        fd = open(lock, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        sk_fail(r,
                "cannot open the autostart lock %s: %s (set STRAPD_SOCKET to a path in a directory you can "
                "write, or start `strapd serve --socket %s` yourself)",
                lock, strerror(errno), sock);
    return fd;
}

/* " (pid N)" of the lock's holder, as it wrote it, or "" */
static void
sk_lock_holder(int fd, char *out, size_t cap)
{
    char b[24];
    ssize_t n = pread(fd, b, sizeof b - 1, 0);
    long pid = 0;
    out[0] = 0;
    for (ssize_t i = 0; i < n && b[i] >= '0' && b[i] <= '9' && pid < 100000000; i++)
        pid = pid * 10 + (b[i] - '0');
    if (pid > 0)
        snprintf(out, cap, " (pid %ld)", pid);
}

/* Connect to strapd on path (already resolved), starting it when nobody answers and autostart
 * is set. The connected socket (close-on-exec, no handshake yet), or -1 with r->msg set
 * (SK_INTERRUPTED: options.interrupted stopped it); r->started_pid names the daemon this call
 * started. */
static int
sk_connect(const char *path, int autostart, const sk_options *o, sk_result *r)
{
    r->started_pid = 0;
    r->log[0] = 0;
    r->msg[0] = 0;
    int fd = sk_try_connect(path);
    if (fd >= 0)
        return fd;
    if (fd != -ENOENT && fd != -ECONNREFUSED) {
        sk_fail(r,
                "cannot connect to strapd on %s: %s (check that %s names strapd's socket; `strapd status --socket "
                "%s`)",
                path, strerror(-fd), sk_or(o->socket_hint, "STRAPD_SOCKET"), path);
        return -1;
    }
    if (!autostart) {
        sk_fail(r, "no strapd answers on %s: %s (start `strapd serve --socket %s` first, or %s)", path, strerror(-fd),
                path, sk_or(o->autostart_hint, "turn autostart on"));
        return -1;
    }
    char dir[4200], lock[4210];
    sk_dirname(path, dir, sizeof dir);
    if (sk_mkdirs(dir) != 0) {
        sk_fail(r,
                "cannot create the socket directory %s: %s (set STRAPD_SOCKET to a path in a directory you can "
                "write)",
                dir, strerror(errno));
        return -1;
    }
    snprintf(lock, sizeof lock, "%s.lock", path);
    int lk = sk_open_lock(lock, path, r);
    if (lk < 0)
        return -1;
    double timeout = o->timeout > 0 ? o->timeout : 10.0;
    double wait = o->lock_timeout >= 0 ? o->lock_timeout : 3 * timeout;
    double deadline = sk_now() + wait;
    for (;;) {
        if (flock(lk, LOCK_EX | LOCK_NB) == 0)
            break;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            sk_fail(r,
                    "flock %s: %s (start `strapd serve --socket %s` yourself, or set STRAPD_SOCKET to a path on a "
                    "local file system)",
                    lock, strerror(errno), path);
            close(lk);
            return -1;
        }
        if ((fd = sk_try_connect(path)) >= 0) { /* the holder's daemon answers */
            close(lk);
            return fd;
        }
        if (sk_now() > deadline) {
            char holder[32];
            sk_lock_holder(lk, holder, sizeof holder);
            sk_fail(r,
                    "no strapd answers on %s after waiting %.0fs for the autostart lock %s, held by another "
                    "process starting strapd%s; if that process is stuck, end it (the lock goes with it), or "
                    "start `strapd serve --socket %s` yourself",
                    path, wait, lock, holder, path);
            close(lk);
            return -1;
        }
        if (o->interrupted && o->interrupted(o->interrupt_arg)) {
            sk_fail(r, "interrupted while waiting for the autostart lock %s", lock);
            close(lk);
            return SK_INTERRUPTED;
        }
        sk_sleep_ms(20);
    }
    fd = sk_try_connect(path); /* a daemon started while this process waited for the lock */
    if (fd < 0) {
        char me[24];
        int n = snprintf(me, sizeof me, "%d\n", (int)getpid());
        /* may fail (read-only): the pid only names the holder in others' errors */
        bool wrote = ftruncate(lk, 0) == 0 && pwrite(lk, me, (size_t)n, 0) == n;
        (void)wrote;
        fd = sk_start_and_wait(path, o, timeout, r);
    }
    close(lk); /* releases the flock */
    return fd;
}

#endif
