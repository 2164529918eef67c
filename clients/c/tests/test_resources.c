/* RESOURCES through a real strapd: events packed into messages of at most 64 KiB (never split)
 * land in "<output>.resources.jsonl" one per line, in order and unchanged; an event that is not
 * a JSON object with a string "event", or that alone exceeds a message, is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { N = 3000 };

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600];
	snprintf(out, sizeof out, "%s/res.strap", d.dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.resources = 1;
	strap_session *s = th_open(&d, &p);
	static char store[N][160];
	static const char *ev[N];
	static size_t len[N];
	for (int i = 0; i < N; i++) {
		len[i] = (size_t)snprintf(
			store[i], sizeof store[i],
			"{\"event\":\"compute_execution\",\"step\":%d,\"module\":\"model.layers.%d.mlp\","
			"\"flops\":%d,\"duration_us\":%d.5,\"text\":\"caf\xc3\xa9\"}",
			i / 10, i % 10, i * 1000, i);
		ev[i] = store[i];
	}
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
	CHECK_RC(s, strap_session_write(s, "m", STRAP_DTYPE_F32, (int64_t[]){1}, 1, "\0\0\0\0", 4, NULL), STRAP_OK);
	CHECK_RC(s, strap_session_resources(s, ev, len, N), STRAP_OK);

	const char *bad[] = {"[1]", "{\"step\":1}", "{\"event\":\"\"}", "{\"event\":7}", "{\"event\":\"x\""};
	for (int i = 0; i < 5; i++) {
		size_t l = strlen(bad[i]);
		CHECK_RC(s, strap_session_resources(s, &bad[i], &l, 1), STRAP_E_INVALID);
	}
	static char huge[70000];
	int hl = snprintf(huge, sizeof huge, "{\"event\":\"x\",\"pad\":\"");
	memset(huge + hl, 'a', 66000);
	memcpy(huge + hl + 66000, "\"}", 3);
	const char *hp = huge;
	size_t hlen = strlen(huge);
	CHECK_RC(s, strap_session_resources(s, &hp, &hlen, 1), STRAP_E_TOO_LARGE);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	strap_session_free(s);

	char path[700];
	snprintf(path, sizeof path, "%s.resources.jsonl", out);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "no resource log %s", path);
	int lines = 0;
	char line[400];
	while (f && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		CHECK(lines < N && strcmp(line, store[lines]) == 0, "line %d: %s", lines, line);
		lines++;
	}
	if (f)
		fclose(f);
	CHECK(lines == N, "%d lines in the resource log, %d events sent", lines, N);
	th_check_stream(out, NULL);
	th_stop_daemon(&d);
	return th_done("resources");
}
