/* The durable writes both clients share (common/strap_checkpoint.c): the atomic replace of a
 * file (sck_write_atomic), the durable unlink, the directory fsync and the token log's
 * append + fdatasync; their failures (the temp file removed, the old file intact, the step and
 * the path named). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "strap_checkpoint.h"

static char dir[64];

/* The file's bytes into buf (NUL-terminated): its length, or -1 when it cannot be read. */
static ssize_t slurp(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, cap - 1);
	close(fd);
	if (n >= 0)
		buf[n] = 0;
	return n;
}

static int put(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	ssize_t w = write(fd, s, strlen(s));
	close(fd);
	return w == (ssize_t)strlen(s) ? 0 : -1;
}

/* How many entries of dir start with prefix. */
static int count_prefix(const char *prefix)
{
	char cmd[200], out[32];
	snprintf(cmd, sizeof cmd, "ls -a %s | grep -c '^%s' || true", dir, prefix);
	th_run(cmd, out, sizeof out);
	return atoi(out);
}

static void test_replace(void)
{
	char path[128], buf[256], why[512];
	snprintf(path, sizeof path, "%s/a.ckpt.json", dir);
	umask(0);
	CHECK(sck_write_atomic(path, "first\n", 6, 0640, why, sizeof why) == 0, "new file: %s", why);
	CHECK(slurp(path, buf, sizeof buf) == 6 && strcmp(buf, "first\n") == 0, "new file holds \"%s\"", buf);
	struct stat st1, st2;
	CHECK(stat(path, &st1) == 0 && (st1.st_mode & 0777) == 0640, "mode %o, want 0640", st1.st_mode & 0777);
	CHECK(sck_write_atomic(path, "second, longer\n", 15, 0640, why, sizeof why) == 0, "replace: %s", why);
	CHECK(slurp(path, buf, sizeof buf) == 15 && strcmp(buf, "second, longer\n") == 0, "replaced holds \"%s\"", buf);
	/* replaced by a rename: a new inode, never the old one rewritten in place */
	CHECK(stat(path, &st2) == 0 && st2.st_ino != st1.st_ino, "inode %llu kept", (unsigned long long)st2.st_ino);
	CHECK(sck_write_atomic(path, "", 0, 0640, NULL, 0) == 0, "empty data, why NULL");
	CHECK(slurp(path, buf, sizeof buf) == 0, "an empty file");
	/* a temp file a crash left behind (this pid's name) is truncated, not appended to */
	char tmp[160];
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
	CHECK(put(tmp, "leftover leftover leftover leftover\n") == 0, "leftover temp file");
	CHECK(sck_write_atomic(path, "third\n", 6, 0640, why, sizeof why) == 0, "over a leftover: %s", why);
	CHECK(slurp(path, buf, sizeof buf) == 6 && strcmp(buf, "third\n") == 0, "holds \"%s\"", buf);
	CHECK(count_prefix("a.ckpt.json.tmp") == 0, "a temp file is left");
	/* a relative path: its directory is "." */
	char cwd[512];
	CHECK(getcwd(cwd, sizeof cwd) && chdir(dir) == 0, "chdir");
	CHECK(sck_write_atomic("rel.json", "r\n", 2, 0600, why, sizeof why) == 0, "relative path: %s", why);
	CHECK(sck_fsync_dir("rel.json", why, sizeof why) == 0, "fsync of \".\": %s", why);
	CHECK(chdir(cwd) == 0, "chdir back");
	CHECK(sck_fsync_dir("/", why, sizeof why) == 0, "fsync of \"/\": %s", why);
}

static void test_failures(void)
{
	char path[128], buf[256], why[512];
	/* the directory does not exist: nothing is created, the open is named with the temp path */
	snprintf(path, sizeof path, "%s/missing/b.json", dir);
	int r = sck_write_atomic(path, "x", 1, 0640, why, sizeof why);
	CHECK(r == -ENOENT, "missing directory: %d (%s)", r, why);
	CHECK(strncmp(why, "open ", 5) == 0 && strstr(why, "/missing/b.json.tmp.") && strstr(why, strerror(ENOENT)),
	      "why: %s", why);
	/* the "directory" is a file: ENOTDIR, the file untouched */
	char file[128];
	snprintf(file, sizeof file, "%s/plain", dir);
	CHECK(put(file, "plain\n") == 0, "plain file");
	snprintf(path, sizeof path, "%s/plain/c.json", dir);
	r = sck_write_atomic(path, "x", 1, 0640, why, sizeof why);
	CHECK(r == -ENOTDIR, "a file as the directory: %d (%s)", r, why);
	CHECK(slurp(file, buf, sizeof buf) == 6 && strcmp(buf, "plain\n") == 0, "the file holds \"%s\"", buf);
	/* the rename fails (the target is a directory): the temp file is removed, the target kept */
	snprintf(path, sizeof path, "%s/isdir", dir);
	CHECK(mkdir(path, 0700) == 0, "mkdir");
	r = sck_write_atomic(path, "x", 1, 0640, why, sizeof why);
	CHECK(r == -EISDIR, "rename over a directory: %d (%s)", r, why);
	CHECK(strncmp(why, "rename ", 7) == 0 && strstr(why, "/isdir.tmp.") && strstr(why, " to ") &&
		      strstr(why, strerror(EISDIR)),
	      "why: %s", why);
	struct stat st;
	CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode), "the directory is kept");
	CHECK(count_prefix("isdir.tmp") == 0, "the temp file is left after a failed rename");
	/* the write fails (RLIMIT_FSIZE: EFBIG past 4 bytes): the temp file removed, the old file intact */
	snprintf(path, sizeof path, "%s/d.json", dir);
	CHECK(sck_write_atomic(path, "old\n", 4, 0640, why, sizeof why) == 0, "old file: %s", why);
	struct rlimit was, small;
	CHECK(getrlimit(RLIMIT_FSIZE, &was) == 0, "getrlimit");
	small = was;
	small.rlim_cur = 4;
	signal(SIGXFSZ, SIG_IGN);
	CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0, "setrlimit");
	r = sck_write_atomic(path, "new, longer than 4 bytes\n", 25, 0640, why, sizeof why);
	CHECK(setrlimit(RLIMIT_FSIZE, &was) == 0, "setrlimit back");
	CHECK(r == -EFBIG, "write past RLIMIT_FSIZE: %d (%s)", r, why);
	CHECK(strncmp(why, "write ", 6) == 0 && strstr(why, "/d.json.tmp."), "why: %s", why);
	CHECK(slurp(path, buf, sizeof buf) == 4 && strcmp(buf, "old\n") == 0, "the old file holds \"%s\"", buf);
	CHECK(count_prefix("d.json.tmp") == 0, "the temp file is left after a failed write");
	/* a path too long for the temp file's name */
	char longp[SCK_PATH_MAX + 8];
	memset(longp, 'a', sizeof longp - 1);
	longp[sizeof longp - 1] = 0;
	CHECK(sck_write_atomic(longp, "x", 1, 0640, why, sizeof why) == -ENAMETOOLONG, "long path: %s", why);
	CHECK(sck_fsync_dir(longp, why, sizeof why) == -ENAMETOOLONG, "long path: %s", why);
	/* a short why is truncated, still NUL-terminated */
	char small_why[8];
	snprintf(path, sizeof path, "%s/missing/e.json", dir);
	CHECK(sck_write_atomic(path, "x", 1, 0640, small_why, sizeof small_why) == -ENOENT, "short why");
	CHECK(strlen(small_why) == sizeof small_why - 1, "short why: \"%s\"", small_why);
	snprintf(path, sizeof path, "%s/missing/f", dir);
	CHECK(sck_fsync_dir(path, why, sizeof why) == -ENOENT && strstr(why, "/missing"), "why: %s", why);
}

static void test_unlink(void)
{
	char path[128], why[512];
	snprintf(path, sizeof path, "%s/g.json", dir);
	CHECK(sck_write_atomic(path, "g\n", 2, 0640, why, sizeof why) == 0, "write: %s", why);
	CHECK(sck_unlink_durable(path, why, sizeof why) == 0, "unlink: %s", why);
	CHECK(access(path, F_OK) != 0 && errno == ENOENT, "still there");
	int r = sck_unlink_durable(path, why, sizeof why);
	CHECK(r == -ENOENT && strncmp(why, "unlink ", 7) == 0 && strstr(why, "/g.json"), "again: %d (%s)", r, why);
}

static void test_append(void)
{
	char path[128], buf[256], why[512];
	snprintf(path, sizeof path, "%s/h.tokens.jsonl", dir);
	CHECK(sck_write_atomic(path, "{\"t\":0}\n", 8, 0640, why, sizeof why) == 0, "log: %s", why);
	int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(fd >= 0, "open: %s", strerror(errno));
	CHECK(sck_append_sync(fd, path, "{\"t\":1}\n", 8, why, sizeof why) == 0, "append: %s", why);
	CHECK(sck_append_sync(fd, path, "", 0, why, sizeof why) == 0, "empty append: %s", why);
	CHECK(sck_append_sync(fd, NULL, "{\"t\":2}\n", 8, why, sizeof why) == 0, "append, no name: %s", why);
	close(fd);
	CHECK(slurp(path, buf, sizeof buf) == 24 && strcmp(buf, "{\"t\":0}\n{\"t\":1}\n{\"t\":2}\n") == 0,
	      "log: \"%s\"", buf);
	/* a descriptor not open for writing: the write and the name in why */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	int r = sck_append_sync(fd, path, "x", 1, why, sizeof why);
	CHECK(r == -EBADF && strncmp(why, "write to ", 9) == 0 && strstr(why, "/h.tokens.jsonl"), "%d (%s)", r, why);
	r = sck_append_sync(fd, NULL, "x", 1, why, sizeof why);
	CHECK(r == -EBADF && strstr(why, "descriptor "), "%d (%s)", r, why);
	close(fd);
	CHECK(slurp(path, buf, sizeof buf) == 24, "the log changed");
	/* a large append goes out whole */
	size_t big = 4 << 20;
	char *data = malloc(big);
	CHECK(data != NULL, "malloc");
	if (!data)
		return;
	th_fill(data, big, 39);
	fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(sck_append_sync(fd, path, data, big, why, sizeof why) == 0, "big append: %s", why);
	close(fd);
	struct stat st;
	CHECK(stat(path, &st) == 0 && (size_t)st.st_size == 24 + big, "size %lld", (long long)st.st_size);
	free(data);
}

int main(void)
{
	snprintf(dir, sizeof dir, "/tmp/strap-durable-XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_replace();
	test_failures();
	test_unlink();
	test_append();
	if (th_failures == 0) {
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
		th_run(cmd, NULL, 0);
	}
	return th_done("durable");
}
