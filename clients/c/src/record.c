/* The dtype tables: strap's wire dtypes and ggml's tensor types (STREAM_FORMAT.md 4 and 4.1).
 * The ring layout they are written with is common/strap_ring.h (header-only, shared with the
 * Python client's extension). */

#include "internal.h"

size_t strap_dtype_size(int dtype)
{
	static const uint8_t sizes[] = {0, 4, 2, 2, 8, 1, 1, 2, 4, 8, 1, 1, 1};
	return dtype > 0 && dtype < (int)sizeof sizes ? sizes[dtype] : 0;
}

/* ggml's block size (elements) and block bytes per type, and the strap dtype of the
 * unquantized ones (0: stored as raw blocks). Numbers from ggml's type_traits. */
static const struct {
	const char *name;
	uint16_t block, bytes;
	uint8_t dtype;
} ggml_types[40] = {
	[STRAP_GGML_F32] = {"f32", 1, 4, STRAP_DTYPE_F32},
	[STRAP_GGML_F16] = {"f16", 1, 2, STRAP_DTYPE_F16},
	[STRAP_GGML_Q4_0] = {"q4_0", 32, 18, 0},
	[STRAP_GGML_Q4_1] = {"q4_1", 32, 20, 0},
	[STRAP_GGML_Q5_0] = {"q5_0", 32, 22, 0},
	[STRAP_GGML_Q5_1] = {"q5_1", 32, 24, 0},
	[STRAP_GGML_Q8_0] = {"q8_0", 32, 34, 0},
	[STRAP_GGML_Q8_1] = {"q8_1", 32, 36, 0},
	[STRAP_GGML_Q2_K] = {"q2_K", 256, 84, 0},
	[STRAP_GGML_Q3_K] = {"q3_K", 256, 110, 0},
	[STRAP_GGML_Q4_K] = {"q4_K", 256, 144, 0},
	[STRAP_GGML_Q5_K] = {"q5_K", 256, 176, 0},
	[STRAP_GGML_Q6_K] = {"q6_K", 256, 210, 0},
	[STRAP_GGML_Q8_K] = {"q8_K", 256, 292, 0},
	[STRAP_GGML_IQ2_XXS] = {"iq2_xxs", 256, 66, 0},
	[STRAP_GGML_IQ2_XS] = {"iq2_xs", 256, 74, 0},
	[STRAP_GGML_IQ3_XXS] = {"iq3_xxs", 256, 98, 0},
	[STRAP_GGML_IQ1_S] = {"iq1_s", 256, 50, 0},
	[STRAP_GGML_IQ4_NL] = {"iq4_nl", 32, 18, 0},
	[STRAP_GGML_IQ3_S] = {"iq3_s", 256, 110, 0},
	[STRAP_GGML_IQ2_S] = {"iq2_s", 256, 82, 0},
	[STRAP_GGML_IQ4_XS] = {"iq4_xs", 256, 136, 0},
	[STRAP_GGML_I8] = {"i8", 1, 1, STRAP_DTYPE_I8},
	[STRAP_GGML_I16] = {"i16", 1, 2, STRAP_DTYPE_I16},
	[STRAP_GGML_I32] = {"i32", 1, 4, STRAP_DTYPE_I32},
	[STRAP_GGML_I64] = {"i64", 1, 8, STRAP_DTYPE_I64},
	[STRAP_GGML_F64] = {"f64", 1, 8, STRAP_DTYPE_F64},
	[STRAP_GGML_IQ1_M] = {"iq1_m", 256, 56, 0},
	[STRAP_GGML_BF16] = {"bf16", 1, 2, STRAP_DTYPE_BF16},
	[STRAP_GGML_TQ1_0] = {"tq1_0", 256, 54, 0},
	[STRAP_GGML_TQ2_0] = {"tq2_0", 256, 66, 0},
	[STRAP_GGML_MXFP4] = {"mxfp4", 32, 17, 0},
};

static bool ggml_known(int t)
{
	return t >= 0 && t < 40 && ggml_types[t].name;
}

const char *strap_ggml_type_name(int t)
{
	return ggml_known(t) ? ggml_types[t].name : NULL;
}

size_t strap_ggml_row_size(int t, int64_t ne0)
{
	if (!ggml_known(t) || ne0 < 0 || ne0 % ggml_types[t].block)
		return 0;
	return (size_t)(ne0 / ggml_types[t].block) * ggml_types[t].bytes;
}

int sr_ggml_dtype(int t)
{
	return ggml_known(t) ? ggml_types[t].dtype : -1;
}
