"""numpy's huge-page advice off while the emulator runs, and while a plan is made.

numpy asks the kernel for transparent huge pages (madvise MADV_HUGEPAGE) on every array of
4 MB or more. An emulator run makes such arrays by the dozen (conv outputs and im2col matrices
of a 640x640 detector, the weights' float32 decode) and frees them a step later, so what the
advice buys is the first touch of each: one fault per 2 MB instead of one per 4 KB. On the
test machine (a VM whose host backs guest memory lazily) that first touch of a huge page took
30-140 ms of CPU in 4 of 6 fresh processes for a 14 MB array, against 8-13 ms every time in
4 KB pages (numpy's own switch, NUMPY_MADVISE_HUGEPAGE=0, gives the same); a mobilenet_v2
first run took 76-103 ms of CPU with the advice off and 77-229 ms with it on. Planning reads and
writes weight-sized arrays once each (onnx-graphsurgeon's copy of a weight it loads, a MatMul's
weight transposed into a Conv's): tv_maxvit_t's plan process 3.12 -> 2.88 s of CPU with the advice
off, mobilenet_v2's 0.53 -> 0.49 s (its 5 MB classifier weight)."""
from __future__ import annotations

from contextlib import contextmanager

try:  # numpy 2
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # numpy 1.x, or a numpy without the switch
    try:
        from numpy.core.multiarray import _set_madvise_hugepage
    except ImportError:
        _set_madvise_hugepage = None


@contextmanager
def small_pages():
    """numpy's huge-page advice off for the duration, as it was afterwards. The switch is
    process-wide: arrays other threads allocate meanwhile get 4 KB pages too, which changes
    their speed, never their values."""
    if _set_madvise_hugepage is None:
        yield
        return
    was_on = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(was_on)
