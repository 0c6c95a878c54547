"""Frozen dataclasses whose methods cost at most one compile per class instead of six.

`dataclasses.dataclass` writes each method it adds as Python source and compiles it with its own
`exec` (Python before 3.13): six methods per frozen class. A float16 plan imports 46 such
classes, and compiling their methods took 40-50 ms of a 0.5 s plan process on the test machine
(cProfile around `dataclasses._create_fn`, issue 18). `frozen_dataclass` lets the dataclass
machinery collect the fields (their defaults, checks and `dataclasses.fields`) and compiles only
__init__, which must stay compiled for its speed and signature: the same parameters and
assignments dataclass(frozen=True) writes, compiled once per shape of record (`_initializer`).
__setattr__ and __delattr__ (refusing
every field, and every name on the class itself) and __eq__, __hash__ and __repr__ are closures
over the field names that behave as the compiled ones do: the same fields compared, hashed and
shown, the same results and errors. A 6-field class took 715 us when dataclass still compiled
__init__, __setattr__ and __delattr__, and takes 279 us (CPU, 10 rounds alternating in one
process on the test machine; docs/zoo.md, "the plan process's start-up").
"""
from __future__ import annotations

import dataclasses
import inspect
from operator import attrgetter
from reprlib import recursive_repr
from types import CodeType, FunctionType
from typing import Callable


def frozen_dataclass(cls: type | None = None, /):
    """`@dataclasses.dataclass(frozen=True)` with equal behaviour: the fields, their defaults,
    __init__ (its parameters, defaults and annotations), immutability (FrozenInstanceError),
    `dataclasses.fields`/`replace`/`asdict`, __eq__ (the compared fields as a tuple,
    NotImplemented against another class), __hash__ (the hash of the hashed fields' tuple),
    __repr__ (`Name(field=value!r, ...)`, `...` when it recurses) and the class docstring
    dataclass writes for a class without one. A method the class body defines itself is kept,
    as dataclass keeps it. What it does not make (a record extending a dataclass, a field left
    out of __init__ or keyword-only, InitVar, __post_init__) is refused with a TypeError."""
    def wrap(klass: type) -> type:
        defines = set(klass.__dict__)
        for method in ("__setattr__", "__delattr__"):
            if method in defines:  # dataclass's own check for a frozen class
                raise TypeError(f"Cannot overwrite attribute {method} in class {klass.__name__}")
        if any(dataclasses.is_dataclass(base) for base in klass.__mro__[1:]):
            raise TypeError("frozen_dataclass records extend no dataclass: use dataclasses.dataclass")
        documented = bool(klass.__doc__)
        class_hash = klass.__dict__.get("__hash__", dataclasses.MISSING)
        # dataclass's rule: a __hash__ the class sets itself is kept, except the None Python sets
        # for a class body that defines __eq__ alone
        explicit_hash = not (class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in defines))
        klass = dataclasses.dataclass(klass, init=False, eq=False, repr=False)
        fields = dataclasses.fields(klass)
        if len(fields) != len(klass.__dataclass_fields__) or hasattr(klass, "__post_init__") \
                or any(not f.init or f.kw_only for f in fields):
            raise TypeError(f"{klass.__name__}: frozen_dataclass takes fields of __init__'s positional parameters "
                            "only (no InitVar, init=False, kw_only or __post_init__): use dataclasses.dataclass")
        first_default = next((i for i, f in enumerate(fields) if _has_default(f)), len(fields))
        follower = next((f.name for f in fields[first_default:] if not _has_default(f)), None)
        if follower is not None:  # dataclass's error, for every class (Python's own would be a SyntaxError)
            raise TypeError(f"non-default argument {follower!r} follows default argument")
        if "__init__" not in defines:
            _set_method(klass, "__init__", _initializer(klass, fields))
            if not documented:  # what dataclass writes, now that __init__ has its signature
                klass.__doc__ = klass.__name__ + str(inspect.signature(klass)).replace(" -> None", "")
        frozen_names = tuple(f.name for f in fields)
        _set_method(klass, "__setattr__", _refusing(klass, frozen_names, "assign to", "__setattr__"))
        _set_method(klass, "__delattr__", _refusing(klass, frozen_names, "delete", "__delattr__"))
        if "__eq__" not in defines:
            _set_method(klass, "__eq__", _equality(_values([f.name for f in fields if f.compare])))
        if not explicit_hash:
            hashed = _values([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
            _set_method(klass, "__hash__", lambda self: hash(hashed(self)))
        if "__repr__" not in defines:
            _set_method(klass, "__repr__", _representation([f.name for f in fields if f.repr]))
        parameters = klass.__dataclass_params__  # as dataclass(frozen=True) would record them
        parameters.init = parameters.eq = parameters.repr = parameters.frozen = True
        return klass

    return wrap if cls is None else wrap(cls)


def _has_default(field: dataclasses.Field) -> bool:
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


class _Factory:
    """An __init__ parameter's default that stands for its field's default_factory (shown as
    dataclass shows it in the signature)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _initializer(cls: type, fields: tuple[dataclasses.Field, ...]):
    """The __init__ dataclass(frozen=True) compiles for `fields`: each a positional parameter
    (with its default, or a default_factory called when it is not given), each stored with
    object.__setattr__. The code is compiled once per shape (how many fields, which of them have
    a factory) and each record of that shape gets a copy with its own names (`CodeType.replace`:
    the same bytecode, so the same speed): 43 records of 17 shapes in a float16 plan process,
    whose __init__ sources took 25 M of a small model's ~1.2 G instructions to compile one by one
    (valgrind; docs/zoo.md, "the plan process's start-up")."""
    names = tuple(field.name for field in fields)
    factories = tuple(i for i, field in enumerate(fields) if field.default_factory is not dataclasses.MISSING)
    template = _INIT_TEMPLATES.get((len(fields), factories))
    if template is None:
        template = _INIT_TEMPLATES[len(fields), factories] = _init_template(len(fields), factories)
    placeholders = {_placeholder(i): name for i, name in enumerate(names)}
    code = template.replace(  # as dataclass does, the instance is not `self` when a field is
        co_varnames=("__dataclass_self__" if "self" in names else "self", *names),
        co_consts=tuple(placeholders.get(value, value) if type(value) is str else value for value in template.co_consts))
    namespace: dict[str, object] = {"__name__": cls.__module__, "__store": object.__setattr__, "__factory": _FACTORY}
    namespace.update((f"__factory_{i}", fields[i].default_factory) for i in factories)
    defaults = tuple(_FACTORY if field.default is dataclasses.MISSING else field.default
                     for field in fields if _has_default(field))
    initializer = FunctionType(code, namespace, "__init__", defaults or None)
    initializer.__annotations__ = {**{field.name: field.type for field in fields}, "return": None}
    return initializer


#: (number of fields, positions of those with a default_factory) -> __init__'s code for that shape
_INIT_TEMPLATES: dict[tuple[int, tuple[int, ...]], CodeType] = {}


def _placeholder(position: int) -> str:
    return f"_{position}"


def _init_template(count: int, factories: tuple[int, ...]) -> CodeType:
    """__init__ for `count` fields named by placeholders (`_placeholder`, as parameters and as
    the attribute names stored): a field with a default_factory calls `__factory_<position>` when
    its parameter is the `__factory` sentinel. The defaults are the function's, set apart."""
    parameters = [_placeholder(i) for i in range(count)]
    body = [f"    __store(self, {name!r}, __factory_{i}() if {name} is __factory else {name})" if i in factories
            else f"    __store(self, {name!r}, {name})" for i, name in enumerate(parameters)]
    namespace: dict[str, object] = {}
    exec(f"def __init__({', '.join(['self', *parameters])}):\n" + ("\n".join(body) or "    pass") + "\n", namespace)
    return namespace["__init__"].__code__


def _refusing(cls: type, names: tuple[str, ...], verb: str, method: str):
    """A frozen dataclass's __setattr__ (verb "assign to") or __delattr__ ("delete"): any name
    on an instance of `cls` itself, or a field's name on a subclass's, raises
    FrozenInstanceError; a subclass's other names go to the next class's `method`."""
    def refuse(self, name, *value):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot {verb} field {name!r}")
        getattr(super(cls, self), method)(name, *value)
    return refuse


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
