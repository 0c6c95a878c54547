"""Progress bars for the loops a user waits on (int8 calibration, accuracy analysis): tqdm on
standard error, drawn only when standard error is a terminal (a log or a pipe gets nothing) and
not inside `quiet()` (the command line's --quiet). The zoo keeps its own bar (rkcompile/commands/zoo.py),
one line per job when not on a terminal."""
from __future__ import annotations

import contextlib
import contextvars
import sys
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:
    from tqdm import tqdm

_SHOWN = contextvars.ContextVar("rkcompile_progress_shown", default=True)


def bar(iterable: Iterable | None = None, total: int | None = None, description: str = "",
        unit: str = "it") -> tqdm:
    """A tqdm bar over `iterable` (or one updated by hand up to `total`), left on screen when done."""
    from tqdm import tqdm  # here: only int8 plans and accuracy analysis draw bars; a float16 plan skips its import

    return tqdm(iterable, total=total, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=None if _SHOWN.get() else True)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No bars inside this block."""
    token = _SHOWN.set(False)
    try:
        yield
    finally:
        _SHOWN.reset(token)
