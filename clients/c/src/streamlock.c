/* The stream lock (docs/CHECKPOINTS.md 5): one live capture per stream file.
 *
 * A session takes flock(LOCK_EX) on its output before it changes a byte of it, and keeps
 * its descriptor (and strapd its copy) until the session is freed. Who holds a taken lock
 * decides: a live process, or a session of this process not yet freed, is a capture still
 * writing, so the open fails at once with STRAP_E_IN_USE naming the pid; waiting for it would
 * only let this session empty the other's finished stream (issue 25). A holder that is gone
 * (a killed client, a zombie) or a session of this process already freed (strapd still
 * ending it) is waited for, up to LOCK_WAIT_S. The holder is the pid /proc/locks shows. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "session.h"

/* This process's sessions holding their stream lock, linked through lock_next: what tells a
 * live session of this process (refuse) from a freed one strapd is still ending (wait). */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static strap_session *live_head;

static bool live_here(dev_t dev, ino_t ino)
{
	bool found = false;
	pthread_mutex_lock(&live_mu);
	for (strap_session *p = live_head; p && !found; p = p->lock_next)
		found = p->lock_dev == dev && p->lock_ino == ino;
	pthread_mutex_unlock(&live_mu);
	return found;
}

/* The pid that took the flock on (dev, ino) per /proc/locks; 0 when none is found (or the
 * inode alone, on a file system whose device /proc/locks shows differently, names several). */
static pid_t lock_holder(dev_t dev, ino_t ino)
{
	FILE *f = fopen("/proc/locks", "re");
	if (!f)
		return 0;
	char line[256], want[64];
	snprintf(want, sizeof want, "%02x:%02x:%" PRIu64, major(dev), minor(dev), (uint64_t)ino);
	pid_t exact = 0, by_ino = 0;
	int n_ino = 0;
	while (fgets(line, sizeof line, f)) {
		/* "12: FLOCK  ADVISORY  WRITE 4321 00:2a:98765 0 EOF"; waiters have "->" first */
		char kind[16], mode[16], how[16], id[64];
		long pid;
		if (sscanf(line, "%*s %15s %15s %15s %ld %63s", kind, mode, how, &pid, id) != 5)
			continue;
		if (strcmp(kind, "FLOCK") != 0 || strcmp(how, "WRITE") != 0 || pid <= 0)
			continue;
		if (strcmp(id, want) == 0) {
			exact = (pid_t)pid;
			break;
		}
		const char *c = strrchr(id, ':');
		if (c && strtoull(c + 1, NULL, 10) == (uint64_t)ino && (pid_t)pid != by_ino) {
			by_ino = (pid_t)pid;
			n_ino++;
		}
	}
	fclose(f);
	return exact ? exact : n_ino == 1 ? by_ino : 0;
}

/* Whether pid runs (a zombie does not: a killed client not yet reaped). */
static bool alive(pid_t pid)
{
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return false;
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return true;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *c = strrchr(buf, ')');
	return !(c && c[1] == ' ' && (c[2] == 'Z' || c[2] == 'X'));
}

int sl_lock(strap_session *s)
{
	struct stat st;
	if (fstat(s->out_fd, &st) != 0)
		return ss_fail(s, STRAP_E_SYSTEM, "fstat %s: %s", s->output_path, strerror(errno));
	double deadline = sc_now() + LOCK_WAIT_S;
	for (;;) {
		if (flock(s->out_fd, LOCK_EX | LOCK_NB) == 0)
			break;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return ss_fail(s, STRAP_E_SYSTEM, "flock %s: %s", s->output_path, strerror(errno));
		if (errno == EINTR)
			continue;
		pid_t pid = lock_holder(st.st_dev, st.st_ino);
		if (pid == 0 && flock(s->out_fd, LOCK_EX | LOCK_NB) == 0)
			break; /* released between the two calls */
		if (pid == 0)
			return ss_fail(s, STRAP_E_IN_USE,
				       "%s is being written by a live capture whose process could not be found in "
				       "/proc/locks: nothing was changed in it; use another output path",
				       s->output_path);
		if (pid == getpid() ? live_here(st.st_dev, st.st_ino) : alive(pid))
			return ss_fail(s, STRAP_E_IN_USE,
				       "%s is being written by a live capture of process %d%s: a second capture of the "
				       "same file would destroy that stream, so nothing was changed in it; use another "
				       "output path (every rank of a distributed job needs its own), or end that "
				       "capture first",
				       s->output_path, (int)pid, pid == getpid() ? " (this process)" : "");
		if (sc_now() > deadline)
			return ss_fail(s, STRAP_E_IN_USE,
				       "%s is in use by a capture that has ended (process %d), but its strapd session "
				       "still holds the stream lock after %ds",
				       s->output_path, (int)pid, LOCK_WAIT_S);
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	s->lock_dev = st.st_dev;
	s->lock_ino = st.st_ino;
	pthread_mutex_lock(&live_mu);
	s->lock_next = live_head;
	live_head = s;
	s->lock_live = true;
	pthread_mutex_unlock(&live_mu);
	return STRAP_OK;
}

void sl_unlock(strap_session *s)
{
	pthread_mutex_lock(&live_mu);
	if (s->lock_live) {
		for (strap_session **p = &live_head; *p; p = &(*p)->lock_next) {
			if (*p == s) {
				*p = s->lock_next;
				break;
			}
		}
		s->lock_live = false;
	}
	pthread_mutex_unlock(&live_mu);
}
