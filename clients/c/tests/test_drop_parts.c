#define _GNU_SOURCE
/* PART records and policy drop through a real strapd. A tensor larger than a quarter of the ring
 * goes as PART records (each its own sequence number) that Python reassembles bit for bit; under
 * policy drop, records that do not fit while nothing can be released (publish_bytes larger than
 * the ring: nothing is published before the flush) become DROP packets, in the stream exactly
 * where the client dropped them and counted in CLOSED. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600], exp_dir[600];
	static uint8_t big[300 << 10];

	/* parts: 300 KiB through a 256 KiB ring (64 KiB records) */
	snprintf(out, sizeof out, "%s/parts.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect-parts", d.dir);
	th_expect x;
	th_expect_open(&x, exp_dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (256 << 10);
	strap_session *s = th_open(&d, &p);
	int64_t shape[2] = {300, 256};
	for (int f = 0; f < 3; f++) { /* no tokens recorded: every pass has step 0 */
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		th_fill(big, sizeof big, (uint64_t)f);
		CHECK_RC(s,
			 strap_session_write(s, "lm_head", STRAP_DTYPE_F32, (int64_t[]){300, 256}, 2, big, sizeof big,
					     NULL),
			 STRAP_OK);
		/* 64 KiB records of a 128-byte header area carry 65408 bytes of payload each */
		th_expect_tensor(&x, "lm_head", "float32", shape, 2, 0, (uint64_t)f, NULL, big, sizeof big,
				 (int)((sizeof big + 65407) / 65408));
		CHECK_RC(s, strap_session_write(s, "small", STRAP_DTYPE_U8, (int64_t[]){100}, 1, big, 100, NULL),
			 STRAP_OK);
		th_expect_tensor(&x, "small", "uint8", (int64_t[]){100}, 1, 0, (uint64_t)f, NULL, big, 100, 1);
		CHECK_RC(s, strap_session_flush(s), STRAP_OK);
	}
	strap_closed c;
	CHECK_RC(s, strap_session_close(s, &c), STRAP_OK);
	strap_session_stats st = strap_session_get_stats(s);
	CHECK(st.records == 3 * 6 && c.packets == st.records, "records %llu, packets %llu",
	      (unsigned long long)st.records, (unsigned long long)c.packets);
	strap_session_free(s);
	th_expect_close(&x);
	th_check_stream(out, &x);

	/* drops */
	snprintf(out, sizeof out, "%s/drops.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect-drops", d.dir);
	th_expect_open(&x, exp_dir);
	p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (64 << 10);
	p.policy = STRAP_POLICY_DROP;
	p.publish_bytes = 1 << 30;
	s = th_open(&d, &p);
	static uint8_t rec[15 << 10];
	int written = 0, dropped = 0;
	for (int f = 0; f < 2; f++) {
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		for (int i = 0; i < 6; i++) {
			char name[32];
			snprintf(name, sizeof name, "layer.%d", i);
			th_fill(rec, sizeof rec, (uint64_t)(f * 10 + i));
			int rc = strap_session_write(s, name, STRAP_DTYPE_U8, (int64_t[]){sizeof rec}, 1, rec,
						     sizeof rec, NULL);
			CHECK(rc == STRAP_OK || rc == STRAP_DROPPED, "write: %d", rc);
			/* 15 KiB + header = 15.1 KiB records: four fit the 64 KiB ring, the rest wait for a
			 * publish that never comes before the flush */
			if (rc == STRAP_OK) {
				written++;
				th_expect_tensor(&x, name, "uint8", (int64_t[]){sizeof rec}, 1, (uint64_t)f,
						 (uint64_t)f, NULL, rec, sizeof rec, 1);
			} else {
				dropped++;
				th_expect_drop(&x, name, sizeof rec);
			}
		}
		CHECK_RC(s, strap_session_flush(s), STRAP_OK);
		CHECK_RC(s, strap_session_token(s, f, "", 0, -1), STRAP_OK);
		th_expect_token(&x, (uint64_t)f, f, "");
		/* let strapd release the ring before the next pass */
		usleep(100000);
	}
	/* The fifth record of each pass is dropped for certain (nothing of the pass was published);
	 * a DROP publishes the records before it, so later ones may fit again once strapd has
	 * released them: how many depends on timing, and the stream must say exactly which. */
	CHECK(dropped >= 2 && written >= 8 && written + dropped == 12, "written %d, dropped %d", written, dropped);
	CHECK_RC(s, strap_session_close(s, &c), STRAP_OK);
	st = strap_session_get_stats(s);
	CHECK(c.drops == (uint64_t)dropped && st.drops == (uint64_t)dropped &&
		      st.drop_bytes == (uint64_t)dropped * sizeof rec,
	      "CLOSED drops %llu, stats %llu", (unsigned long long)c.drops, (unsigned long long)st.drops);
	strap_session_free(s);
	th_expect_close(&x);
	th_check_stream(out, &x);
	th_stop_daemon(&d);
	return th_done("drop_parts");
}
