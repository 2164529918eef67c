"""Run vLLM (CPU, eager, float32) on token-id prompts, greedy, and print what it generated
as JSON: the child process of tests/vllm_engine/test_vllm_capture.py and of `make demo-vllm`.

The plugin is whatever the environment says (STRAP_VLLM_OUTPUT set or not): this script
does nothing of its own to capture, exactly as a user's script would not.

Usage: run_vllm.py MODEL_DIR OUT_JSON --prompts 5,11,17 --max-tokens 8
       [--max-num-batched-tokens N] [--opt-in 0,2] [--seed S] [--kv-cache-kib K]
       [--block-size B] [--max-model-len L] [--no-prefix-caching] [--warmup] [--tp N] [--pp N]
       [--prefix-reuse N] [--checkpoint] [--abort K:A]
"""

from __future__ import annotations

import argparse
import json
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--prompts", default="5,11,17", help="prompt lengths, one request each")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--opt-in", default=None, help="indices of the requests that set extra_args strap=True")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--kv-cache-kib", type=int, default=256 << 10)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--warmup", action="store_true", help="generate once (other prompts) before the timed run")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    ap.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size")
    ap.add_argument("--checkpoint", action="store_true",
                    help="then llm_instrumentation.vllm.checkpoint(llm) and read every request back "
                         "while the engine still runs")
    ap.add_argument("--prefix-reuse", type=int, default=0,
                    help="then one more request: the last prompt's first N tokens and 5 new ones")
    ap.add_argument("--abort", default=None, metavar="K:A",
                    help="run the requests through llm.llm_engine step by step and abort request K once it "
                         "has A generated tokens (LLMEngine.abort_request)")
    a = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    lengths = [int(x) for x in a.prompts.split(",")]
    opt_in = {int(x) for x in a.opt_in.split(",")} if a.opt_in else None
    rng = random.Random(a.seed)
    with open(f"{a.model}/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]

    kw = {}
    if a.max_num_batched_tokens is not None:
        kw.update(max_num_batched_tokens=a.max_num_batched_tokens, enable_chunked_prefill=True,
                  max_num_seqs=min(a.max_num_batched_tokens, len(prompts)))
    t0 = time.monotonic()
    if a.block_size is not None:
        kw.update(block_size=a.block_size)
    if a.no_prefix_caching:
        kw.update(enable_prefix_caching=False)
    if a.tp > 1:
        kw.update(tensor_parallel_size=a.tp)
    if a.pp > 1:
        kw.update(pipeline_parallel_size=a.pp)
    llm = LLM(model=a.model, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
              max_model_len=a.max_model_len, kv_cache_memory_bytes=a.kv_cache_kib << 10, seed=0, **kw)
    started = time.monotonic() - t0
    params = []
    for i in range(len(prompts)):
        extra = None
        if opt_in is not None:
            extra = {"strap": i in opt_in}
        params.append(SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True, detokenize=False,
                                     extra_args=extra))
    if a.warmup:
        warm = [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in warm], params)
    t1 = time.monotonic()
    aborted = []
    if a.abort:
        k, after = (int(x) for x in a.abort.split(":"))
        eng = llm.llm_engine
        for i, p in enumerate(prompts):
            eng.add_request(str(i), TokensPrompt(prompt_token_ids=p), params[i])
        last = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                last[o.request_id] = o  # cumulative outputs: the last one holds every token
            got = last.get(str(k))
            if not aborted and got is not None and len(got.outputs[0].token_ids) >= after:
                eng.abort_request([str(k)])
                aborted.append(str(k))
        outs = [last[str(i)] for i in range(len(prompts))]
    else:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    took = time.monotonic() - t1
    if a.prefix_reuse:
        again = prompts[-1][:a.prefix_reuse] + [rng.randrange(3, vocab) for _ in range(5)]
        outs = list(outs) + list(llm.generate([TokensPrompt(prompt_token_ids=again)], params[-1]))
    res = {"startup_s": started, "generate_s": took, "requests": [
        {"request_id": o.request_id, "prompt": list(o.prompt_token_ids), "generated": list(o.outputs[0].token_ids)}
        for o in outs], "aborted": aborted}
    if a.checkpoint:
        import os

        from llm_instrumentation.vllm import checkpoint, list_requests, load_request

        res["checkpoint"] = checkpoint(llm)
        d = os.environ["STRAP_VLLM_OUTPUT"]
        res["loaded_before_exit"] = {rid: load_request(d, rid).token_ids.tolist() for rid in list_requests(d)}
    import os as _os

    if _os.environ.get("STRAP_VLLM_OUTPUT"):
        from llm_instrumentation.vllm._plugin import captures

        # an in-process engine's workers: their segment rotations, (close ms, open ms) each
        res["rotations"] = [list(t) for c in captures() for t in c.rotations]
    with open(a.out, "w") as f:
        json.dump(res, f)
    # Nothing to close by hand: the plugin closes each worker's stream when vLLM shuts its
    # model runner down, or at the worker's exit.


if __name__ == "__main__":
    main()
