"""Python's cyclic garbage collector paused around work that makes many objects at once."""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def cyclic_collector_paused():
    """Python's cyclic garbage collector off for the duration. Each collection that object
    creation triggers walks every live object of the process, so building many objects while
    many are alive grows faster than the work itself: 2 s of a 7.5 s 20,000-node plan
    (tools/bench_scale.py), and 40-60% of rebuilding a 2,000-step plan's step nodes before an
    emulator run. Reference counting still frees everything without cycles at once; the
    cycles wait for the collector's next run afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
