/* The control connection's datagrams (strap_channel.h). libstrap and the Python client's
 * _speedups extension both compile this file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "strap_channel.h"

int
sch_send(int fd, const void *data, size_t n, const int *fds, int nfds)
{
    struct iovec iov = {(void *)data, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int) * SCH_MAX_FDS)];
        struct cmsghdr align;
    } u;
    if (nfds < 0 || nfds > SCH_MAX_FDS)
        return -EINVAL;
    if (nfds > 0) {
        memset(&u, 0, sizeof u);
        m.msg_control = u.buf;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    for (;;) {
        ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (r >= 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

ssize_t
sch_recv(int fd, uint8_t *buf, size_t cap, int timeout_ms)
{
    if (timeout_ms != 0) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, timeout_ms);
        if (r == 0 || (r < 0 && errno == EINTR))
            return -EAGAIN;
        if (r < 0)
            return -errno;
    }
    for (;;) {
        /* MSG_TRUNC: the real datagram length, so an oversized one is caught */
        ssize_t r = recv(fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC);
        if (r >= 0)
            return r;
        if (errno == EINTR)
            continue;
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    }
}

int
sch_salvage(int fd, uint8_t *buf, size_t cap, void (*each)(const uint8_t *msg, size_t n, void *arg), void *arg)
{
    int got = 0;
    for (int i = 0; i < 256; i++) {
        ssize_t n = sch_recv(fd, buf, cap, 0);
        if (n == -ECONNRESET)
            continue;
        if (n <= 0 || (size_t)n > cap)
            break;
        each(buf, (size_t)n, arg);
        got++;
    }
    return got;
}
