"""A heap reserve: new heap written once and freed, kept from being trimmed (standalone: the
injected sitecustomize imports it from beside itself, perfswarm from its package).

Inside a profiling window, the profiler's small allocations take pieces of the holes freed
tensors leave in glibc's heap; a tensor that no longer fits any then lands at the top of the
heap, on new pages that fault on first write. The heap grows every step (a CPU transformer:
4,000 page faults a step, 14,000 at twice the width, none without the profiler), and the
window's steps pay for it: about 1 us a page on bare hardware, ten times that in a VM whose
host backs new memory lazily, which took steps from 125 to 280 ms. A calibration sweep meets
the same when each new, larger output grows the heap. Freed, the reserve is one large free
block below the heap's top (its last block stays allocated, else the rest would be trimmed
back to the system), and such tensors are carved from memory already resident instead.

`steady_heap` raises glibc's mmap threshold to about its cap, for a measurement that must meet
the allocator as a running process does (`perfswarm fuse`'s PyTorch side).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no import at run time: every process the recorder starts loads this module
    from typing import Any

RESERVE_BLOCK = 64 << 10  # under glibc's smallest mmap threshold (128 KiB): heap, not mmap
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's cap on its dynamic mmap threshold (64-bit)


def _libc() -> Any:
    import ctypes  # here, for the same reason

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    return libc


def reserve_heap(mib: int) -> None:
    """Write `mib` MiB of new heap in RESERVE_BLOCK blocks, then free all but the last."""
    if mib <= 0:
        return
    import ctypes

    libc = _libc()
    blocks = []
    for _ in range((mib << 20) // RESERVE_BLOCK):
        block = libc.malloc(RESERVE_BLOCK)
        if not block:
            break
        ctypes.memset(block, 0, RESERVE_BLOCK)
        blocks.append(block)
    for block in blocks[:-1]:  # the last, at the heap's top, stays allocated
        libc.free(block)


def steady_heap() -> None:
    """Have glibc serve every block of up to (about) MMAP_THRESHOLD_MAX from its heap, kept between
    calls, not from a fresh mmap each (which faults on every page at first write, every call):
    freeing an mmapped block raises glibc's dynamic mmap threshold to its size and the trim
    threshold to twice that (mallopt(3)), which a long-running process's frees of large tensors
    do. Larger blocks are mmapped in any process. (A threshold of the largest tensor alone is
    not enough: a call's temporaries, freed together at the heap's top, pass twice it and are
    trimmed back to the system.)"""
    libc = _libc()
    # a block of the cap itself, with its header and page rounding, is past it: ignored
    libc.free(libc.malloc(MMAP_THRESHOLD_MAX - (1 << 20)))
