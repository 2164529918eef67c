"""GPU probe: cost of cudaHostRegister on a memfd ring, whole vs chunks, and copies across chunk borders."""
import json, mmap, os, sys, threading, time
import torch
out = {}
cr = torch.cuda.cudart()
def memfd(size):
    fd = os.memfd_create("probe", 0); os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    t = torch.frombuffer(mm, dtype=torch.uint8)
    return fd, mm, t
def code(rc): return int(rc.value) if hasattr(rc, "value") else int(rc)
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
MiB = 1 << 20
for size_mib in (256, 64):
    for trial in range(2):
        fd, mm, t = memfd(size_mib * MiB)
        t0 = time.perf_counter(); rc = code(cr.cudaHostRegister(t.data_ptr(), size_mib * MiB, 0)); dt = time.perf_counter() - t0
        out[f"whole_{size_mib}MiB_try{trial}_ms"] = round(dt * 1e3, 2); out[f"whole_{size_mib}_rc"] = rc
        cr.cudaHostUnregister(t.data_ptr())
        # again on the same (now faulted) pages
        t0 = time.perf_counter(); rc = code(cr.cudaHostRegister(t.data_ptr(), size_mib * MiB, 0)); dt = time.perf_counter() - t0
        out[f"whole_{size_mib}MiB_faulted_try{trial}_ms"] = round(dt * 1e3, 2)
        cr.cudaHostUnregister(t.data_ptr())
        del t; mm.close(); os.close(fd)
# pre-faulted with MADV_POPULATE_WRITE before registering
fd, mm, t = memfd(256 * MiB)
t0 = time.perf_counter(); mm.madvise(23) if hasattr(mm, "madvise") else None; out["populate_256_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
t0 = time.perf_counter(); code(cr.cudaHostRegister(t.data_ptr(), 256 * MiB, 0)); out["whole_256_after_populate_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
cr.cudaHostUnregister(t.data_ptr()); del t; mm.close(); os.close(fd)
# chunks
for ch in (16,):
    fd, mm, t = memfd(256 * MiB)
    base = t.data_ptr(); times = []
    for i in range(256 // ch):
        t0 = time.perf_counter(); rc = code(cr.cudaHostRegister(base + i * ch * MiB, ch * MiB, 0)); times.append(time.perf_counter() - t0)
        assert rc == 0, rc
    out[f"chunk{ch}_first_ms"] = round(times[0] * 1e3, 2); out[f"chunk{ch}_median_ms"] = round(sorted(times)[len(times)//2] * 1e3, 2)
    out[f"chunk{ch}_total_ms"] = round(sum(times) * 1e3, 2)
    # copy across a chunk border
    src = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)  # 2 MiB
    off = ch * MiB - MiB
    dst = t[off:off + 2 * MiB].view(torch.bfloat16)
    out[f"chunk{ch}_dst_is_pinned"] = bool(dst.is_pinned())
    try:
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(20): dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / 20
        out[f"chunk{ch}_cross_copy_gbps"] = round(2 * MiB / dt / 1e9, 2)
        out[f"chunk{ch}_cross_copy_equal"] = bool(torch.equal(dst.cpu(), src.cpu()))
    except Exception as e:
        out[f"chunk{ch}_cross_copy_error"] = repr(e)
    dst2 = t[ch * MiB + 4096: ch * MiB + 4096 + 2 * MiB].view(torch.bfloat16)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(20): dst2.copy_(src, non_blocking=True)
    torch.cuda.synchronize(); out[f"chunk{ch}_inside_copy_gbps"] = round(2 * MiB / ((time.perf_counter() - t0) / 20) / 1e9, 2)
    # non-blocking-ness: does the cross-chunk copy return before the GPU finishes? time the call alone
    big = torch.randn(4 << 20, device="cuda", dtype=torch.bfloat16)
    d3 = t[off: off + 8 * MiB].view(torch.bfloat16) if ch >= 16 else None
    if d3 is not None:
      try:
        torch.cuda.synchronize(); t0 = time.perf_counter(); d3.copy_(big, non_blocking=True); out[f"chunk{ch}_cross_8MiB_call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        torch.cuda.synchronize(); out[f"chunk{ch}_cross_8MiB_total_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        d4 = t[2 * ch * MiB: 2 * ch * MiB + 8 * MiB].view(torch.bfloat16)
        torch.cuda.synchronize(); t0 = time.perf_counter(); d4.copy_(big, non_blocking=True); out[f"chunk{ch}_inside_8MiB_call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        torch.cuda.synchronize(); out[f"chunk{ch}_inside_8MiB_total_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
      except Exception as e:
        out[f"chunk{ch}_cross_8MiB_error"] = repr(e)[:200]
      print(json.dumps(out), flush=True)
      break
    for i in range(256 // ch): cr.cudaHostUnregister(base + i * ch * MiB)
    del t, dst, dst2; mm.close(); os.close(fd)
# GIL released during cudaHostRegister?
fd, mm, t = memfd(256 * MiB)
n = [0]; stop = [False]
def spin():
    while not stop[0]: n[0] += 1
th = threading.Thread(target=spin); th.start(); time.sleep(0.05)
a = n[0]; t0 = time.perf_counter(); code(cr.cudaHostRegister(t.data_ptr(), 256 * MiB, 0)); dt = time.perf_counter() - t0; b = n[0]
stop[0] = True; th.join()
out["gil_loops_per_s_during_register"] = round((b - a) / dt); out["register_with_thread_ms"] = round(dt * 1e3, 2)
cr.cudaHostUnregister(t.data_ptr())
print(json.dumps(out, indent=1))
open(os.path.join(os.environ.get("OUT", "/tmp"), "reg_probe.json"), "w").write(json.dumps(out, indent=1))
