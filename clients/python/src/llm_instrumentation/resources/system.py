"""What the operating system and torch say about memory: the process's resident set, its
peak, the machine's memory use, a GPU's allocator."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

from .._cuda import device_memory

__all__ = ["FRACTION_MAX_AGE", "MemoryReader", "Rss", "host_memory_fraction", "now_us", "peak_rss",
           "pressure_word"]

#: Seconds a reading of the machine's memory use serves the forward passes that follow: the
#: kernel makes /proc/meminfo anew on each read (about 0.1 ms here), a cost per decoding step.
FRACTION_MAX_AGE = 0.25


def now_us() -> int:
    """Unix time in µs."""
    return time.time_ns() // 1000


class Rss:
    """The process's resident set size from ``/proc/self/statm`` (one pread)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._fd: Optional[int] = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def read(self) -> Optional[int]:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) * self._page
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class MemoryReader:
    """The memory reading events carry: a GPU's allocator figures, or the process's RSS on
    the CPU (an empty reading where /proc cannot say)."""

    def __init__(self) -> None:
        self.cuda = False
        self.rss = Rss()

    def read(self) -> Dict[str, Any]:
        if self.cuda:
            allocated, reserved, peak = device_memory()
            return {"device_memory_allocated_bytes": allocated, "device_memory_reserved_bytes": reserved,
                    "device_memory_peak_bytes": peak, "memory_source": "torch.cuda.memory_stats"}
        rss = self.rss.read()
        return {"process_rss_bytes": rss, "memory_source": "proc_self_statm"} if rss is not None else {}

    def close(self) -> None:
        self.rss.close()


def peak_rss() -> Optional[int]:
    """The process's peak resident set (``VmHWM``), in bytes."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_memory_fraction() -> Optional[float]:
    """1 − MemAvailable/MemTotal from /proc/meminfo."""
    try:
        total = avail = None
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    total = int(line.split()[1])
                elif line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1])
                if total is not None and avail is not None:
                    return 1.0 - avail / total
    except (OSError, ValueError, ZeroDivisionError):
        pass
    return None


def pressure_word(fraction: Optional[float]) -> Optional[str]:
    """``low`` below 50 %, ``medium`` below 80 %, else ``high``."""
    if fraction is None:
        return None
    return "low" if fraction < 0.5 else "medium" if fraction < 0.8 else "high"
