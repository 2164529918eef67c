"""GPU probe: make the ring's pages exist before cudaHostRegister (fallocate, parallel MADV_POPULATE_WRITE)."""
import ctypes, json, mmap, os, threading, time
import torch
cr = torch.cuda.cudart(); libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MiB = 1 << 20; SIZE = 256 * MiB; out = {}
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
def memfd():
    fd = os.memfd_create("probe", 0); os.ftruncate(fd, SIZE)
    mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return fd, mm, torch.frombuffer(mm, dtype=torch.uint8)
def reg(t):
    t0 = time.perf_counter(); rc = cr.cudaHostRegister(t.data_ptr(), SIZE, 0); dt = time.perf_counter() - t0
    cr.cudaHostUnregister(t.data_ptr()); return dt
def close(fd, mm, t):
    del t; mm.close(); os.close(fd)
for rep in range(2):
    fd, mm, t = memfd(); out[f"plain_register_ms_{rep}"] = round(reg(t) * 1e3, 1); close(fd, mm, t)
    fd, mm, t = memfd(); t0 = time.perf_counter(); os.posix_fallocate(fd, 0, SIZE); a = time.perf_counter() - t0
    out[f"fallocate_ms_{rep}"] = round(a * 1e3, 1); out[f"fallocate_then_register_ms_{rep}"] = round(reg(t) * 1e3, 1); close(fd, mm, t)
    for nth in (1, 4, 8):
        fd, mm, t = memfd(); base = t.data_ptr(); part = SIZE // nth; errs = []
        def work(i):
            if libc.madvise(ctypes.c_void_p(base + i * part), part, 23) != 0: errs.append(ctypes.get_errno())
        t0 = time.perf_counter(); ths = [threading.Thread(target=work, args=(i,)) for i in range(nth)]
        [x.start() for x in ths]; [x.join() for x in ths]; a = time.perf_counter() - t0
        out[f"populate{nth}_ms_{rep}"] = round(a * 1e3, 1); out[f"populate{nth}_errs"] = errs[:2]
        out[f"populate{nth}_then_register_ms_{rep}"] = round(reg(t) * 1e3, 1); close(fd, mm, t)
    # parallel populate + register on its own: fallocate in 8 threads (inode lock?)
    fd, mm, t = memfd(); part = SIZE // 8
    t0 = time.perf_counter(); ths = [threading.Thread(target=os.posix_fallocate, args=(fd, i * part, part)) for i in range(8)]
    [x.start() for x in ths]; [x.join() for x in ths]; out[f"fallocate8_ms_{rep}"] = round((time.perf_counter() - t0) * 1e3, 1)
    out[f"fallocate8_then_register_ms_{rep}"] = round(reg(t) * 1e3, 1); close(fd, mm, t)
    print(json.dumps(out), flush=True)
print(open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read().strip())
open(os.path.join(os.environ.get("OUT", "/tmp"), "populate_probe.json"), "w").write(json.dumps(out, indent=1))
