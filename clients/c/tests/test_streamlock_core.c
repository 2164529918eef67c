/* The stream lock's one implementation, common/strap_streamlock.h (CHECKPOINTS.md 5), on its
 * own: the holder read from /proc/locks text, live or gone (a zombie is gone), a gone holder
 * waited for and then taken, the deadline, this process's live capture refused at once (and
 * waited for once marked ended), the wait stopped by interrupted(). test_stream_lock.c checks
 * the same through libstrap's sessions and the real strapd. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "strap_streamlock.h"

static void holder_text(void)
{
	const char *t = "1: POSIX  ADVISORY  WRITE 11 08:01:99 0 EOF\n" /* not a flock */
			"2: FLOCK  ADVISORY  READ  12 08:01:99 0 EOF\n" /* shared */
			"3: FLOCK  ADVISORY  WRITE 4242 08:01:99 0 EOF\n"
			"3: -> FLOCK  ADVISORY  WRITE 13 08:01:99 0 EOF\n" /* a waiter */
			"4: FLOCK  ADVISORY  WRITE 14 00:01:100 0 EOF\n";
	CHECK(stl_holder_in(t, strlen(t), 8, 1, 99) == 4242, "holder %d", (int)stl_holder_in(t, strlen(t), 8, 1, 99));
	/* another device numbering: the inode alone, when one pid has it; none when two do */
	const char *one = "1: FLOCK  ADVISORY  WRITE 77 ff:ff:99 0 EOF";
	CHECK(stl_holder_in(one, strlen(one), 8, 1, 99) == 77, "by inode");
	const char *two = "1: FLOCK  ADVISORY  WRITE 77 ff:ff:99 0 EOF\n2: FLOCK  ADVISORY  WRITE 78 fe:ff:99 0 EOF\n";
	CHECK(stl_holder_in(two, strlen(two), 8, 1, 99) == 0, "two holders by inode name none");
	const char *same = "1: FLOCK  ADVISORY  WRITE 77 ff:ff:99 0 EOF\n2: FLOCK  ADVISORY  WRITE 77 fe:ff:99 0 EOF\n";
	CHECK(stl_holder_in(same, strlen(same), 8, 1, 99) == 77, "one pid twice is one holder");
	const char *bad[] = {"1: FLOCK ADVISORY WRITE -5 08:01:99 0 EOF",
			     "1: FLOCK ADVISORY WRITE 0 08:01:99 0 EOF",
			     "1: FLOCK ADVISORY WRITE 99999999999 08:01:99 0 EOF",
			     "1: FLOCK ADVISORY WRITE 5x 08:01:99",
			     "1: FLOCK ADVISORY WRITE 5",
			     "",
			     "1: FLOCK ADVISORY WRITE 5 08:01:999 0 EOF",
			     "1: FLOCK ADVISORY WRITE 5 :99x"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		CHECK(stl_holder_in(bad[i], strlen(bad[i]), 8, 1, 99) == 0, "%s names a holder", bad[i]);
	CHECK(stl_holder(0, 0, "/nonexistent/locks") == 0, "a missing locks file names none");
}

static void alive(void)
{
	CHECK(stl_alive(getpid()), "this process is not alive");
	pid_t c = fork();
	if (c == 0)
		_exit(0);
	/* exited, not reaped: a zombie is gone */
	bool gone = false;
	for (int i = 0; i < 200 && !gone; i++) {
		gone = !stl_alive(c);
		if (!gone)
			usleep(10000);
	}
	CHECK(gone, "the zombie %d counts as alive", (int)c);
	waitpid(c, NULL, 0);
	CHECK(!stl_alive(c), "a reaped process counts as alive");
}

/* A lock taken by a child that then exits, kept by a grandchild's copy of the descriptor for
 * hold_ms (strapd's copy, in a capture): the holder /proc/locks shows is gone. */
static void gone_holder(const char *path, int hold_ms)
{
	pid_t c = fork();
	if (c == 0) {
		int fd = open(path, O_RDWR);
		if (fd < 0 || flock(fd, LOCK_EX) != 0)
			_exit(1);
		if (fork() == 0) {
			usleep((useconds_t)hold_ms * 1000);
			_exit(0);
		}
		_exit(0);
	}
	int st;
	waitpid(c, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "locker failed");
}

static double t_now(void)
{
	return stl_now();
}

static int stop_at_once(void *ctx)
{
	(*(int *)ctx)++;
	return 1;
}

int main(void)
{
	holder_text();
	alive();

	char dir[] = "/tmp/strap-lock-XXXXXX", path[600];
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(path, sizeof path, "%s/s.strap", dir);
	int fd = open(path, O_RDWR | O_CREAT, 0640);
	CHECK(fd >= 0 && write(fd, "kept", 4) == 4, "create %s", path);
	struct stat st;
	CHECK(fstat(fd, &st) == 0, "fstat");
	static stl_result r;

	/* a gone holder: waited for, then taken */
	gone_holder(path, 1500);
	CHECK(stl_holder(st.st_dev, st.st_ino, NULL) != 0, "no /proc/locks entry for the held lock");
	double t0 = t_now();
	int v = stl_lock(fd, st.st_dev, st.st_ino, path, 30, NULL, path, NULL, NULL, &r);
	double took = t_now() - t0;
	CHECK(v == STL_LOCKED, "verdict %d: %s", v, r.msg);
	CHECK(took > 0.5 && took < 20, "took %.2fs", took);
	CHECK(stl_live_path(st.st_dev, st.st_ino, NULL, 0), "not marked live on taking it");

	/* this process's live capture: refused at once, by another descriptor of the file */
	int fd2 = open(path, O_RDWR);
	t0 = t_now();
	v = stl_lock(fd2, st.st_dev, st.st_ino, path, 30, NULL, NULL, NULL, NULL, &r);
	CHECK(v == STL_LIVE_HERE && r.pid == getpid(), "verdict %d pid %d", v, (int)r.pid);
	char want[128];
	snprintf(want, sizeof want, "this process (pid %d) that has not stopped", (int)getpid());
	CHECK(strstr(r.msg, want) && strstr(r.msg, path), "message: %s", r.msg);
	CHECK(t_now() - t0 < 5, "a live holder was waited for");

	/* marked ended but still locked here: waited for (until the deadline) */
	stl_mark_ended(st.st_dev, st.st_ino);
	CHECK(!stl_live_path(st.st_dev, st.st_ino, NULL, 0), "still marked live");
	v = stl_lock(fd2, st.st_dev, st.st_ino, path, 0.2, NULL, NULL, NULL, NULL, &r);
	CHECK(v == STL_TIMEOUT && r.pid == getpid(), "verdict %d", v);
	CHECK(strstr(r.msg, "still holds the stream lock after 0s") != NULL, "message: %s", r.msg);
	int asked = 0;
	v = stl_lock(fd2, st.st_dev, st.st_ino, path, 30, NULL, NULL, stop_at_once, &asked, &r);
	CHECK(v == STL_INTERRUPTED && asked == 1, "verdict %d asked %d", v, asked);

	/* another live process: refused at once, naming it */
	close(fd);
	int p[2];
	CHECK(pipe(p) == 0, "pipe");
	pid_t c = fork();
	if (c == 0) {
		int cfd = open(path, O_RDWR);
		char b = flock(cfd, LOCK_EX) == 0 ? 'y' : 'n';
		if (write(p[1], &b, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	char b = 0;
	CHECK(read(p[0], &b, 1) == 1 && b == 'y', "child lock");
	v = stl_lock(fd2, st.st_dev, st.st_ino, path, 30, NULL, NULL, NULL, NULL, &r);
	snprintf(want, sizeof want, "a live capture of process %d", (int)c);
	CHECK(v == STL_LIVE && r.pid == c && strstr(r.msg, want), "verdict %d: %s", v, r.msg);
	/* a holder /proc/locks does not show is taken to be alive */
	v = stl_lock(fd2, st.st_dev, st.st_ino, path, 30, "/nonexistent/locks", NULL, NULL, NULL, &r);
	CHECK(v == STL_UNKNOWN && r.pid == 0 && strstr(r.msg, "could not be found in /proc/locks"), "verdict %d: %s", v,
	      r.msg);
	kill(c, SIGKILL);
	waitpid(c, NULL, 0);
	v = stl_lock(fd2, st.st_dev, st.st_ino, path, 5, NULL, NULL, NULL, NULL, &r);
	CHECK(v == STL_LOCKED, "after the holder died: verdict %d: %s", v, r.msg);
	close(fd2);

	char got[5] = {0};
	FILE *f = fopen(path, "rb");
	CHECK(f && fread(got, 1, 4, f) == 4 && memcmp(got, "kept", 4) == 0, "the file changed");
	if (f)
		fclose(f);
	unlink(path);
	rmdir(dir);
	return th_done("streamlock_core");
}
