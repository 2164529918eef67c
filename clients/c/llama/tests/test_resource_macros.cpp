// Seed 003's spelling from C++ (make test-llamacpp, tests/test_resources_llama.py): the enum
// class levels, braced input lists and std::vector inputs, every macro, on real ggml tensors (shapes
// only: nothing is computed). Writes the JSONL file named by argv[1]; the Python test reads it.
#include "llama-resource-instrumentation.h"

#include <cstdio>
#include <vector>

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	ggml_init_params ip = {16 * 1024 * 1024, nullptr, true}; // no_alloc: shapes only
	ggml_context *ctx = ggml_init(ip);
	ggml_tensor *wq = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 64, 64); // ne = [K, N]
	ggml_set_name(wq, "blk.0.attn_q.weight");
	ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 5);
	ggml_set_name(x, "attn_norm-0");
	ggml_tensor *q = ggml_mul_mat(ctx, wq, x);
	ggml_set_name(q, "Qcur-0");
	ggml_tensor *wg = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 64, 128);
	ggml_set_name(wg, "blk.0.ffn_gate.weight");
	ggml_tensor *g = ggml_mul_mat(ctx, wg, x);
	ggml_tensor *big = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1024, 512);

	if (llama_resource_instrumentation_init(llama_resource_level::DETAILED, argv[1]) != STRAP_OK)
		return 1;
	LLAMA_RESOURCE_BEGIN_SESSION("inference_sess_cpp");
	llama_resource_begin_forward(0);
	LLAMA_RESOURCE_LOG_MEMORY_ALLOCATION(big, "token_embd");
	LLAMA_RESOURCE_BEGIN_LAYER(0);
	LLAMA_RESOURCE_BEGIN_COMPONENT("attention");
	LLAMA_RESOURCE_LOG_COMPUTE_OPERATION("mul_mat", "model.layers.0.self_attn.q_proj", {wq, x}, q);
	std::vector<const ggml_tensor *> inputs = {x};
	LLAMA_RESOURCE_LOG_COMPUTE_OPERATION("rms_norm", "model.layers.0.input_layernorm", inputs, x);
	LLAMA_RESOURCE_END_COMPONENT("attention");
	LLAMA_RESOURCE_LOG_COMPONENT_HANDOFF("attention", "mlp");
	LLAMA_RESOURCE_BEGIN_COMPONENT("mlp");
	LLAMA_RESOURCE_LOG_MLP_OPERATION("gate_proj", wg, g);
	LLAMA_RESOURCE_END_COMPONENT("mlp");
	LLAMA_RESOURCE_END_LAYER(0);
	llama_resource_end_forward();
	g_resource_instr->set_level(llama_resource_level::VERBOSE); // seed 003's run-time control
	if (llama_resource_get_level() != LLAMA_RESOURCE_VERBOSE || g_resource_instr->flush() != STRAP_OK)
		return 1;
	LLAMA_RESOURCE_END_SESSION();
	int rc = llama_resource_instrumentation_free();
	ggml_free(ctx);
	std::printf("ok\n");
	return rc == STRAP_OK ? 0 : 1;
}
