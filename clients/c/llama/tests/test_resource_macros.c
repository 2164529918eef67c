/* Seed 003's macros from C (make test-llamacpp, tests/test_resources_llama.py): inputs as a
 * pointer and a count, on real ggml tensors (shapes only). Writes the JSONL file argv[1]. */
#include "llama-resource-instrumentation.h"

#include <stdio.h>

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	struct ggml_init_params ip = {16 * 1024 * 1024, NULL, true};
	struct ggml_context *ctx = ggml_init(ip);
	struct ggml_tensor *wq = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 64, 64);
	ggml_set_name(wq, "blk.0.attn_q.weight");
	struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 5);
	struct ggml_tensor *q = ggml_mul_mat(ctx, wq, x);
	struct ggml_tensor *wg = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 64, 128);
	struct ggml_tensor *g = ggml_mul_mat(ctx, wg, x);
	struct ggml_tensor *big = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1024, 512);

	if (llama_resource_instrumentation_init(LLAMA_RESOURCE_DETAILED, argv[1]) != STRAP_OK)
		return 1;
	LLAMA_RESOURCE_BEGIN_SESSION("inference_sess_c");
	llama_resource_begin_forward(0);
	LLAMA_RESOURCE_LOG_MEMORY_ALLOCATION(big, "token_embd");
	LLAMA_RESOURCE_BEGIN_LAYER(0);
	LLAMA_RESOURCE_BEGIN_COMPONENT("attention");
	const struct ggml_tensor *in[2] = {wq, x};
	LLAMA_RESOURCE_LOG_COMPUTE_OPERATION("mul_mat", "model.layers.0.self_attn.q_proj", in, 2, q);
	LLAMA_RESOURCE_LOG_COMPUTE_OPERATION("rms_norm", "model.layers.0.input_layernorm", &in[1], 1, x);
	LLAMA_RESOURCE_END_COMPONENT("attention");
	LLAMA_RESOURCE_LOG_COMPONENT_HANDOFF("attention", "mlp");
	LLAMA_RESOURCE_BEGIN_COMPONENT("mlp");
	LLAMA_RESOURCE_LOG_MLP_OPERATION("gate_proj", wg, g);
	LLAMA_RESOURCE_END_COMPONENT("mlp");
	LLAMA_RESOURCE_END_LAYER(0);
	llama_resource_end_forward();
	LLAMA_RESOURCE_END_SESSION();
	int rc = llama_resource_instrumentation_free();
	ggml_free(ctx);
	printf("ok\n");
	return rc == STRAP_OK ? 0 : 1;
}
