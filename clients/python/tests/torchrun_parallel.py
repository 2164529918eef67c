"""One rank of the multi-rank capture tests (test_parallel_capture.py): a gloo process group on
CPU, the hand-written decoder of parallel_models.py split as ``mode`` says, and the same
``capture_activations(output_path=DIR/cap.strap, ...)`` call on every rank.

Modes: ``dp`` (every rank its own batch, no layout given), ``pp`` (one stage per rank,
``parallel_layout={"pp_size": world}``), ``tp`` (tp over every rank, a DeviceMesh ``("tp",)``),
``tpdp`` (4 ranks, DeviceMesh ``("dp", "tp")`` of 2 × 2), ``pptp`` (4 ranks,
``{"tp_size": 2, "pp_size": 2}``).

Each rank runs its forward passes three times: a warm-up, then with the public functions of
``torch.distributed`` counted, once without a capture and once inside it; both counts go to ``DIR/calls.RANK.json``
for the parent to compare (a capture adds no collective on the model's path), with the names of
those the capture's start and end called (no collective there either).

argv: mode socket outdir — each may be a comma-separated list, one per "host": rank r then uses
the (r mod n)-th socket and output directory (two strapd daemons, two directories, as two hosts
would have; the parent's calls files go to the first directory).
"""

import functools
import inspect
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parallel_models as pm  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402

COUNT = {"on": False, "n": 0, "names": {}, "session": False, "session_names": {}}


def count_calls() -> None:
    """Wrap every public function of torch.distributed (and of c10d, which it re-exports)."""
    for mod in (dist, c10d):
        for name, fn in list(vars(mod).items()):
            if name.startswith("_") or not inspect.isfunction(fn):
                continue

            def wrapper(*a, __fn=fn, __name=name, **kw):
                if COUNT["on"]:
                    COUNT["n"] += 1
                    COUNT["names"][__name] = COUNT["names"].get(__name, 0) + 1
                if COUNT["session"]:
                    COUNT["session_names"][__name] = COUNT["session_names"].get(__name, 0) + 1
                return __fn(*a, **kw)

            setattr(mod, name, functools.wraps(fn)(wrapper))


def main() -> None:
    mode, socks, outdirs = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sock, outdir = socks[rank % len(socks)], outdirs[rank % len(outdirs)]
    layout = None
    if mode == "dp":
        model, dp_rank = pm.Decoder(), rank
    elif mode == "pp":
        model, dp_rank = pm.Decoder(stage=rank, stages=world, pp_peers=range(world)), 0
        layout = {"pp_size": world}
    elif mode in ("tp", "tpdp"):
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = ((world,), ("tp",)) if mode == "tp" else ((2, 2), ("dp", "tp"))
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        tp_rank = mesh.get_local_rank("tp")
        dp_rank = mesh.get_local_rank("dp") if mode == "tpdp" else 0
        model = pm.Decoder(tp=mesh.size(names.index("tp")), rank=tp_rank, group=mesh.get_group("tp"), mesh=mesh)
        layout = mesh
    elif mode == "pptp":
        from torch.distributed.device_mesh import init_device_mesh

        # the model's mesh (for its DTensor and tp groups); the capture is told the layout by a dict
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
        tp_rank, stage = rank % 2, rank // 2
        model = pm.Decoder(tp=2, rank=tp_rank, stage=stage, stages=2, group=mesh.get_group("tp"),
                           pp_peers=[tp_rank, 2 + tp_rank], mesh=mesh)
        dp_rank, layout = 0, {"tp_size": 2, "pp_size": 2}
    else:
        raise SystemExit(f"unknown mode {mode}")
    model.eval()
    ins = pm.inputs(dp_rank)
    count_calls()
    with torch.no_grad():
        for x in ins:  # warm-up: first calls (DTensor's) ask torch.distributed things once, then cache
            model(x)
        COUNT["on"] = True
        for x in ins:
            model(x)
        COUNT["on"] = False
        plain, plain_names = COUNT["n"], dict(COUNT["names"])
        COUNT["n"], COUNT["names"] = 0, {}
        session = capture_activations(model, output_path=os.path.join(outdir, "cap.strap"), preset="fast_capture",
                                      modules=pm.MODULES, socket_path=sock, autostart_daemon=False,
                                      track_per_token=True, parallel_layout=layout, sharding=pm.SHARDING)
        COUNT["session"] = True  # what the capture's start and end call (the end gathers the manifest)
        fw = session.__enter__()
        COUNT["session"] = False
        COUNT["on"] = True
        for x in ins:
            for tok in x[0].tolist():
                fw.record_token(tok, str(tok))
            model(x)
        COUNT["on"] = False
        COUNT["session"] = True
        session.__exit__(None, None, None)
        COUNT["session"] = False
    with open(os.path.join(outdirs[0], f"calls.{rank}.json"), "w") as f:
        json.dump({"plain": plain, "plain_names": plain_names, "captured": COUNT["n"],
                   "captured_names": COUNT["names"], "session_names": COUNT["session_names"],
                   "output_path": fw.output_path,
                   "capture_set_path": fw.capture_set_path}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
