/* The C client's cost per record for decode-size tensors, measured as the Python client's is
 * (clients/python/benchmarks/record_cost.py, docs/PERFORMANCE.md "Client cost per record"):
 * a forward pass of a Llama-shaped decoder writes 3 x layers records of 1 x 1 x hidden float32
 * (2 KiB for hidden 512) and ends with one PUBLISH (strap_session_flush). Each round times
 * `forwards` passes after a warm-up, for the thread's CPU time (waiting on the daemon and other
 * processes' load do not count) and wall time; the median over rounds and the range are printed,
 * per record, with a JSON line for bench/.
 *
 * Usage: bench_record [--rounds 9] [--forwards 400] [--hidden 512] [--layers 8]
 * It starts $STRAPD_BIN on a temporary socket (harness.c) and stops it at the end. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static double clock_s(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int rounds = 9, forwards = 400, hidden = 512, layers = 8;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--rounds"))
			rounds = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--forwards"))
			forwards = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--hidden"))
			hidden = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--layers"))
			layers = atoi(argv[i + 1]);
	}
	if (rounds < 1 || rounds > 99 || forwards < 1 || hidden < 1 || layers < 1 || layers > 200) {
		fprintf(stderr, "bad arguments\n");
		return 2;
	}
	int per = 3 * layers;
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600];
	snprintf(out, sizeof out, "%s/bench.strap", d.dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	strap_session *s = th_open(&d, &p);
	size_t n = (size_t)hidden * 4;
	float *src = malloc(n * (size_t)per);
	th_fill(src, n * (size_t)per, 1);
	char(*names)[64] = malloc(64 * (size_t)per);
	for (int l = 0; l < layers; l++) {
		snprintf(names[3 * l], 64, "model.layers.%d", l);
		snprintf(names[3 * l + 1], 64, "model.layers.%d.self_attn", l);
		snprintf(names[3 * l + 2], 64, "model.layers.%d.mlp", l);
	}
	int64_t shape[3] = {1, 1, hidden};
	double cpu[99], wall[99];
	for (int r = -1; r < rounds; r++) { /* round -1 warms the ring's pages and the caches */
		double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC);
		for (int f = 0; f < forwards; f++) {
			strap_session_begin_forward(s);
			for (int i = 0; i < per; i++) {
				if (strap_session_write(s, names[i], STRAP_DTYPE_F32, shape, 3,
							(char *)src + n * (size_t)i, n, NULL) != STRAP_OK) {
					strap_error e;
					strap_session_last_error(s, &e);
					fprintf(stderr, "write: %s\n", e.message);
					return 1;
				}
			}
			if (strap_session_flush(s) != STRAP_OK)
				return 1;
		}
		double c1 = clock_s(CLOCK_THREAD_CPUTIME_ID), w1 = clock_s(CLOCK_MONOTONIC);
		if (r >= 0) {
			cpu[r] = (c1 - c0) / ((double)forwards * per) * 1e6;
			wall[r] = (w1 - w0) / ((double)forwards * per) * 1e6;
		}
	}
	strap_closed c;
	if (strap_session_close(s, &c) != STRAP_OK)
		return 1;
	strap_session_free(s);
	th_stop_daemon(&d);
	qsort(cpu, (size_t)rounds, sizeof *cpu, cmp);
	qsort(wall, (size_t)rounds, sizeof *wall, cmp);
	printf("C client per record, 1x1x%d float32 (%zu B), %d records per forward, %d forwards x %d rounds:\n",
	       hidden, n, per, forwards, rounds);
	printf("  CPU  %.3f us median [%.3f-%.3f]\n", cpu[rounds / 2], cpu[0], cpu[rounds - 1]);
	printf("  wall %.3f us median [%.3f-%.3f]\n", wall[rounds / 2], wall[0], wall[rounds - 1]);
	printf("  packets written by strapd: %llu\n", (unsigned long long)c.packets);
	printf("{\"bench\":\"c_record_cost\",\"hidden\":%d,\"records_per_forward\":%d,\"forwards\":%d,\"rounds\":%d,"
	       "\"cpu_us_median\":%.4f,\"cpu_us_min\":%.4f,\"cpu_us_max\":%.4f,\"wall_us_median\":%.4f,\"wall_us_min\":"
	       "%.4f,"
	       "\"wall_us_max\":%.4f,\"target_us\":2.0,\"met\":%s}\n",
	       hidden, per, forwards, rounds, cpu[rounds / 2], cpu[0], cpu[rounds - 1], wall[rounds / 2], wall[0],
	       wall[rounds - 1], cpu[rounds / 2] <= 2.0 ? "true" : "false");
	free(src);
	free(names);
	return 0;
}
