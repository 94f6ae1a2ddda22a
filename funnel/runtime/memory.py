"""Freed memory goes back to the system. glibc's allocator keeps what a thread
freed in that thread's arena (one per thread that ever contended, up to eight per
core) and, after the first large block is freed, raises the size from which it
maps blocks of their own, so that later large blocks come from the arenas too.
Under a flood of transcript imports the chunks of gRPC's threads and of the event
loop then stayed resident long after every import had ended (issue 21: 77 MB to
1.7 GB over six floods). With a fixed threshold, blocks from 128 KiB up are
mapped and unmapped on their own, and two arenas bound what small blocks leave
behind."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 * 1024
ARENA_MAX = 2


def return_freed_memory() -> bool:
    """Tunes glibc's allocator (before the process starts its threads); False,
    changing nothing, on another C library."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_ARENA_MAX, ARENA_MAX))
    if not tuned:
        log.warning("the C library refused the allocator settings; freed memory may stay resident")
    return tuned
