"""Frozen dataclasses whose __eq__, __hash__ and __repr__ are shared functions.

`dataclasses.dataclass` writes each method it adds as Python source and compiles it with its own
`exec` (Python before 3.13): six methods per frozen class. A float16 plan imports 52 such
classes, and compiling their methods took 40-50 ms of a 0.5 s plan process on the test machine
(cProfile around `dataclasses._create_fn`, issue 18). `frozen_dataclass` lets the dataclass
machinery compile only what differs per class in a way that matters for speed or signature
(__init__, and the frozen __setattr__/__delattr__ it writes together with frozen=True) and
gives __eq__, __hash__ and __repr__ as closures over the field names, which behave as the
compiled ones do: the same fields compared, hashed and shown, the same results.
"""
from __future__ import annotations

import dataclasses
from operator import attrgetter
from reprlib import recursive_repr
from typing import Callable


def frozen_dataclass(cls: type | None = None, /, **options):
    """`@dataclasses.dataclass(frozen=True, **options)` with equal behaviour: the fields, their
    defaults, __init__, immutability, `dataclasses.fields`/`replace`/`asdict`, and __eq__ (the
    compared fields as a tuple, NotImplemented against another class), __hash__ (the hash of
    the hashed fields' tuple) and __repr__ (`Name(field=value!r, ...)`, `...` when it recurses).
    A method the class body defines itself is kept, as dataclass keeps it."""
    if "eq" in options or "repr" in options or "frozen" in options or "order" in options \
            or "unsafe_hash" in options:
        raise TypeError("frozen_dataclass makes frozen, compared, hashed records: use dataclasses.dataclass")

    def wrap(klass: type) -> type:
        defines = set(klass.__dict__)
        class_hash = klass.__dict__.get("__hash__", dataclasses.MISSING)
        # dataclass's rule: a __hash__ the class sets itself is kept, except the None Python sets
        # for a class body that defines __eq__ alone
        explicit_hash = not (class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in defines))
        klass = dataclasses.dataclass(klass, frozen=True, eq=False, repr=False, **options)
        fields = dataclasses.fields(klass)
        if "__eq__" not in defines:
            _set_method(klass, "__eq__", _equality(_values([f.name for f in fields if f.compare])))
        if not explicit_hash:
            hashed = _values([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
            _set_method(klass, "__hash__", lambda self: hash(hashed(self)))
        if "__repr__" not in defines:
            _set_method(klass, "__repr__", _representation([f.name for f in fields if f.repr]))
        parameters = klass.__dataclass_params__  # as dataclass(frozen=True) would record them
        parameters.eq = parameters.repr = True
        return klass

    return wrap if cls is None else wrap(cls)


def _values(names: list[str]) -> Callable[[object], tuple]:
    """The attributes `names` of an object as a tuple (one C call: operator.attrgetter)."""
    if not names:
        return lambda obj: ()
    getter = attrgetter(*names)
    return getter if len(names) > 1 else (lambda obj: (getter(obj),))


def _equality(compared: Callable[[object], tuple]):
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return compared(self) == compared(other)
        return NotImplemented
    return __eq__


def _representation(names: list[str]):
    @recursive_repr()
    def __repr__(self):
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"
    return __repr__


def _set_method(cls: type, name: str, function) -> None:
    function.__name__ = name
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, function)
