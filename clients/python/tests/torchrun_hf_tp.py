"""One rank of test_parallel_capture.py's transformers test: a tiny Llama saved by the parent,
loaded with ``tp_plan="auto"`` (transformers' own tensor parallelism, gloo on CPU), captured
with ``parallel_layout`` = the model's device mesh and no ``sharding=``: which outputs are
pieces comes from the model's tensor-parallel plan.

argv: model_dir socket outdir
"""

import os
import sys

import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM

from llm_instrumentation import capture_activations

MODULES = ["model.layers.*.self_attn.q_proj", "model.layers.*.mlp.up_proj", "model.layers.*.mlp.down_proj"]

if __name__ == "__main__":
    model_dir, sock, outdir = sys.argv[1:4]
    torch.set_num_threads(1)
    model = LlamaForCausalLM.from_pretrained(model_dir, tp_plan="auto", dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(7)
    ins = [torch.randint(0, 100, (1, 6), generator=g) for _ in range(2)]
    with torch.no_grad(), capture_activations(model, output_path=os.path.join(outdir, "cap.strap"),
                                              preset="fast_capture", modules=MODULES, socket_path=sock,
                                              autostart_daemon=False, parallel_layout=model._device_mesh) as fw:
        for x in ins:
            model(x)
    print(f"rank {dist.get_rank()} wrote {fw.output_path}", flush=True)
    dist.destroy_process_group()
