/* The stream lock (docs/CHECKPOINTS.md 5): one live capture per stream file, through the
 * client side's one implementation, common/strap_streamlock.h (the Python client's extension
 * compiles the same). A session takes flock(LOCK_EX) on its output before it changes a byte
 * of it and is marked live in this process until it is freed (it keeps its descriptor, and
 * with it the lock, until then). A live holder — another live process, or a session of this
 * process not yet freed — fails the open at once with STRAP_E_IN_USE naming the pid; one that
 * is gone (a killed client, a zombie; strapd still ending its session) is waited for. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "session.h"
#include "strap_streamlock.h"

/* fstat by its system call where the kernel's struct stat is libc's (x86_64, aarch64): the libc
 * symbol is fstat@GLIBC_2.33, newer than the Python wheels' glibc floor (2.17), and libstrap is
 * compiled into the Python client's extension. */
static int file_stat(int fd, struct stat *st)
{
#if defined(__x86_64__) || defined(__aarch64__)
	return (int)syscall(SYS_fstat, fd, st);
#else
	return fstat(fd, st);
#endif
}

int sl_lock(strap_session *s, double wait_s)
{
	stl_result *r = malloc(sizeof *r);
	if (!r)
		return ss_fail(s, STRAP_E_NOMEM, "out of memory");
	struct stat st;
	if (file_stat(s->out_fd, &st) != 0) {
		free(r);
		return ss_fail(s, STRAP_E_SYSTEM, "fstat %s: %s", s->output_path, strerror(errno));
	}
	int v = stl_lock(s->out_fd, st.st_dev, st.st_ino, s->output_path, wait_s, NULL, s->output_path, NULL, NULL, r);
	int e = STRAP_OK;
	if (v == STL_ERROR)
		e = ss_fail(s, r->err == ENOMEM ? STRAP_E_NOMEM : STRAP_E_SYSTEM, "%s", r->msg);
	else if (v != STL_LOCKED)
		e = ss_fail(s, STRAP_E_IN_USE, "%s", r->msg);
	else {
		s->lock_dev = st.st_dev;
		s->lock_ino = st.st_ino;
		s->lock_live = true;
	}
	free(r);
	return e;
}

void sl_unlock(strap_session *s)
{
	if (s->lock_live)
		stl_mark_ended(s->lock_dev, s->lock_ino);
	s->lock_live = false;
}
