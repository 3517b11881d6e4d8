"""Memory and allocator control for the benchmark (Linux; harmless no-ops elsewhere)."""
from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys


class PeakRSS:
    """Peak-RSS probe (Linux). ``measure(fn)`` returns ``(result, bytes or None)``.

    Known side effect: ``__init__`` fixes glibc's mmap threshold for the whole process, so every later allocation
    above 128 KiB is an mmap with page faults; timings taken in the same process are biased against code with many
    medium temporaries (measured: a Focus prefill at 256 tokens 0.885x the original with it, 0.95-1.01x without).
    Timed runs should keep the default allocator: ``bench-model`` takes its peaks in a last pass after every timing.
    The kernel bench (``bench.prefill``) still measures in its first timed repeat, every function under the same
    pinned threshold."""

    def __init__(self):
        self.ok = sys.platform.startswith("linux") and os.path.exists("/proc/self/clear_refs")
        self.libc = None
        if self.ok:
            try:
                self.libc = ctypes.CDLL("libc.so.6")
                self.libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, so big frees go back to the OS
            except OSError:
                self.libc = None

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def measure(self, fn):
        if not self.ok:
            return fn(), None
        gc.collect()
        if self.libc is not None:
            self.libc.malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.ok = False
            return fn(), None
        base = self._status("VmRSS")
        out = fn()
        return out, max(0, self._status("VmHWM") - base)


# glibc allocator regimes for the decode step, whose cost is small enough that page faults on its temporaries
# matter: "heap" = mmap threshold 32 MiB, trim threshold 64 MiB (glibc's dynamic maximum, where a long-running
# process ends up: freed temporaries are reused), "mmap" = 128 KiB (as pinned by the memory probe of the prefill
# run: every temporary of >= 128 KiB is fresh zeroed pages). Left to glibc's dynamic threshold, the result depends
# on what ran before (the order of the other kernels).
MALLOC_REGIMES = (("heap", 32 << 20), ("mmap", 128 << 10))


def set_mmap_threshold(nbytes: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    gc.collect()
    libc.malloc_trim(0)
    # M_MMAP_THRESHOLD, and M_TRIM_THRESHOLD at twice it (glibc's own rule when it adjusts the threshold itself:
    # else freeing a large temporary at the heap top would return its pages, and the next call would fault them in)
    return bool(libc.mallopt(-3, int(nbytes))) and bool(libc.mallopt(-1, 2 * int(nbytes)))


def frozen_heap(fn):
    """Run ``fn`` with every object alive at the start moved to the collector's permanent generation
    (``gc.freeze``): the ``gc.collect()`` before each measurement then walks only the benchmark's own objects,
    not the whole host process (a test session holds millions), and frees the same garbage."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        gc.collect()
        gc.freeze()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.unfreeze()

    return run
