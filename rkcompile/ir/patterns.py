"""A small dataflow-pattern language over the gs graph, in the spirit of TVM's relay patterns.

A pattern describes the tensor a fused kernel produces, read backwards from the node that
produces it (the root):

- `Op(ops, *inputs)` matches a tensor made by a node whose op is one of `ops`; that node becomes
  a member of the fusion. `inputs` constrain the node's first inputs in order; inputs beyond them
  are taken as they are (a Conv's weight and bias). `commutative=True` also tries two inputs
  swapped.
- `Chain(op, *terms)` matches `terms` combined by one associative and commutative binary op
  (Add, Mul) in any order and grouping: `Chain("Mul", x, Const(0.5), y)` matches
  `(x * 0.5) * y`, `x * (y * 0.5)`, `0.5 * (y * x)`, ... so a recogniser states the terms once
  and never lists the orders exporters write.
- `Any()` matches any tensor: it becomes an input of the fused kernel.
- `Const(value)` matches a constant, with `value` a scalar the constant must equal.
- `Alt(a, b, ...)` matches the first alternative that fits; `optional(wrap, inner)` is
  `Alt(wrap(inner), inner)`.

A `label` binds what a pattern matched. A later pattern with the same label must match the same
tensor (`Any`, `Const`) or the same node (`Op`): that is how `x * sigmoid(x)` says both factors
are one tensor, and how a decomposed LayerNorm reuses `x - mean` twice.

Matching backtracks: `match` yields every way a pattern fits, so a caller can skip a match
that fails a later check (two consumers, a cycle) and take the next.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FUSED_DOMAIN, is_onnx_domain


@dataclass(frozen=True)
class Match:
    """What a pattern bound: labelled tensors and nodes, and the member nodes, root first."""

    tensors: dict[str, gs.Tensor] = field(default_factory=dict)
    nodes: dict[str, gs.Node] = field(default_factory=dict)
    members: tuple[gs.Node, ...] = ()

    def with_tensor(self, label: str | None, tensor: gs.Tensor) -> "Match":
        if label is None:
            return self
        return Match({**self.tensors, label: tensor}, self.nodes, self.members)

    def with_member(self, label: str | None, node: gs.Node) -> "Match":
        nodes = {**self.nodes, label: node} if label else self.nodes
        return Match(self.tensors, nodes, self.members + (node,))

    def constant(self, label: str) -> np.ndarray:
        return np.asarray(self.tensors[label].values)


class Pattern:
    def match(self, tensor: gs.Tensor, found: Match) -> Iterable[Match]:
        raise NotImplementedError

    def root_ops(self) -> frozenset[str] | None:
        """The ops a node producing a matching tensor can have, or None when the pattern also
        matches a tensor no listed op produces (`Any`, `Const`): what lets the fuse pass skip,
        without matching, every rule that cannot fit at a node."""
        return None

    def required_ops(self) -> tuple[frozenset[str], ...]:
        """Sets of ops every match has a member of, one member per set at least: what lets the
        fuse pass skip, without matching, every rule that cannot fit anywhere in a graph (GELU's
        Erf or Tanh in a CNN that has neither, tried at each of its Muls). Worked out once per
        pattern (patterns are immutable), kept beside its fields as Chain keeps its splits."""
        needs = self.__dict__.get("_required_ops")
        if needs is None:
            needs = self._required_ops()
            object.__setattr__(self, "_required_ops", needs)  # not a field: equality and hash ignore it
        return needs

    def _required_ops(self) -> tuple[frozenset[str], ...]:
        return ()  # `Any` and `Const` need no member


@dataclass(frozen=True)
class Any(Pattern):
    """Any tensor; with a label, bound on first match, and the same tensor after that."""

    label: str | None = None

    def match(self, tensor, found):
        bound = found.tensors.get(self.label) if self.label else None
        if bound is None:
            return (found.with_tensor(self.label, tensor),)
        return (found,) if bound is tensor else ()


@dataclass(frozen=True)
class Const(Pattern):
    """A constant; with `value`, a single-element constant equal to it (to float16 precision,
    since exporters write e.g. 1/6 and sqrt(2) as rounded float32)."""

    value: float | None = None
    label: str | None = None

    def match(self, tensor, found):
        if not isinstance(tensor, gs.Constant):
            return
        if self.value is not None:
            values = np.asarray(tensor.values)
            if values.size != 1 or not np.isclose(float(values.reshape(-1)[0]), self.value, rtol=1e-3, atol=1e-6):
                return
        yield from Any(self.label).match(tensor, found)


@dataclass(frozen=True)
class Op(Pattern):
    """A tensor written by a node of one of `ops` whose inputs match `inputs` in order (in
    either order when `commutative`)."""

    ops: tuple[str, ...]
    inputs: tuple[Pattern, ...] = ()
    label: str | None = None
    output: int = 0
    commutative: bool = False

    def __init__(self, ops: str | tuple[str, ...], *inputs: Pattern, label: str | None = None,
                 output: int = 0, commutative: bool = False):
        object.__setattr__(self, "ops", (ops,) if isinstance(ops, str) else tuple(ops))
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "commutative", commutative)

    def root_ops(self):
        return frozenset(self.ops)

    def _required_ops(self):
        # the node itself, then what its matched inputs need (in either order, the same inputs)
        return _member_then(frozenset(self.ops), self.inputs)

    def match(self, tensor, found):
        # Not a generator: most calls meet a tensor no node of `ops` wrote (the fuse pass tries
        # each rule's alternatives at every node of a root op), and end at a test, without a
        # generator frame made and resumed to say nothing.
        if len(tensor.inputs) != 1:
            return ()
        node = tensor.inputs[0]
        if node.op not in self.ops or not (is_onnx_domain(node) or node.domain == FUSED_DOMAIN):
            return ()
        if len(node.outputs) <= self.output or node.outputs[self.output] is not tensor:
            return ()
        bound = found.nodes.get(self.label) if self.label else None
        if bound is not None:
            return (found,) if bound is node else ()
        if any(member is node for member in found.members):
            return ()  # reaching a member again must be said with a label
        if len(node.inputs) < len(self.inputs):
            return ()
        found = found.with_member(self.label, node)
        if self.commutative and len(self.inputs) == 2:
            return itertools.chain(_match_all(self.inputs, node.inputs, found),
                                   _match_all(self.inputs[::-1], node.inputs, found))
        return _match_all(self.inputs, node.inputs, found)


@dataclass(frozen=True)
class Chain(Pattern):
    """`terms` combined by `op` in any order and grouping (see the module docstring). The root
    node gets `label`. A chain of n terms is n - 1 member nodes; a term may itself be a
    product or sum of the same op only when a pattern says so (then it is one of `terms`)."""

    op: str
    terms: tuple[Pattern, ...]
    label: str | None = None

    def __init__(self, op: str, *terms: Pattern, label: str | None = None):
        # Unlabelled chains of the same op nested in `terms` are one chain: flatten them.
        flat: list[Pattern] = []
        for term in terms:
            nested = isinstance(term, Chain) and term.op == op and term.label is None
            flat.extend(term.terms if nested else (term,))
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "terms", tuple(flat))
        object.__setattr__(self, "label", label)

    def root_ops(self):
        return self.terms[0].root_ops() if len(self.terms) == 1 else frozenset((self.op,))

    def _required_ops(self):
        if len(self.terms) == 1:
            return self.terms[0].required_ops()
        return _member_then(frozenset((self.op,)), self.terms)

    def match(self, tensor, found):
        if len(self.terms) == 1:
            return self.terms[0].match(tensor, found)
        return itertools.chain.from_iterable(root.match(tensor, found) for root in self._splits())

    def _splits(self) -> tuple[Op, ...]:
        """The root node's patterns: every split of the terms between its two inputs, in both
        orders. Built on the first match and kept: the fuse pass tries a chain at every node of
        its root op, and building the splits again each time was a tenth of the pass."""
        splits = self.__dict__.get("_split_roots")
        if splits is None:
            splits = []
            for mask in range(1, 2 ** len(self.terms) - 1):
                left = tuple(t for i, t in enumerate(self.terms) if mask >> i & 1)
                right = tuple(t for i, t in enumerate(self.terms) if not mask >> i & 1)
                splits.append(Op(self.op, _chain_of(self.op, left), _chain_of(self.op, right), label=self.label))
            splits = tuple(splits)
            object.__setattr__(self, "_split_roots", splits)  # not a field: equality and hash ignore it
        return splits


def _chain_of(op: str, terms: tuple[Pattern, ...]) -> Pattern:
    return terms[0] if len(terms) == 1 else Chain(op, *terms)


def _match_all(patterns, tensors, found: Match) -> Iterable[Match]:
    """Every way `patterns` fit `tensors` in order, each pattern given what the ones before
    it bound. The last pattern's matches are passed on as they come, without a generator of
    its own around them."""
    if not patterns:
        return (found,)
    if len(patterns) == 1:
        return patterns[0].match(tensors[0], found)
    return (whole for partial in patterns[0].match(tensors[0], found)
            for whole in _match_all(patterns[1:], tensors[1:], partial))


@dataclass(frozen=True)
class Alt(Pattern):
    """Every match of each of `options`, in their order."""

    options: tuple[Pattern, ...]

    def __init__(self, *options: Pattern):
        object.__setattr__(self, "options", options)

    def root_ops(self):
        options = [option.root_ops() for option in self.options]
        return None if any(ops is None for ops in options) else frozenset().union(*options)

    def _required_ops(self):
        # A match is one option's: it has a member of each set every option needs, and of one
        # set of each option's needs, so of their union, for every choice of one set per option
        # (at most ALT_REQUIREMENTS choices; beyond, the union of all their ops, true and weaker).
        choices = [option.required_ops() for option in self.options]
        if not all(choices):
            return ()  # an option that needs no member
        shared = tuple(ops for ops in choices[0] if all(ops in needs for needs in choices[1:]))
        if math.prod(len(needs) for needs in choices) > ALT_REQUIREMENTS:
            return _distinct(shared + (frozenset().union(*(ops for needs in choices for ops in needs)),))
        return _distinct(shared + tuple(frozenset().union(*chosen) for chosen in itertools.product(*choices)))

    def match(self, tensor, found):
        return itertools.chain.from_iterable(option.match(tensor, found) for option in self.options)


#: most sets of ops `Alt.required_ops` lists
ALT_REQUIREMENTS = 64


def _distinct(needs: tuple[frozenset[str], ...]) -> tuple[frozenset[str], ...]:
    return tuple(dict.fromkeys(needs))


def _member_then(ops: frozenset[str], patterns: tuple[Pattern, ...]) -> tuple[frozenset[str], ...]:
    """The needs of a member node of one of `ops` whose inputs match `patterns`."""
    return _distinct((ops,) + tuple(needed for pattern in patterns for needed in pattern.required_ops()))


def optional(wrap: Callable[[Pattern], Pattern], inner: Pattern) -> Pattern:
    """`wrap(inner)` when the graph has the wrapping op, else `inner` alone."""
    return Alt(wrap(inner), inner)


def matches(pattern: Pattern, root: gs.Node) -> Iterator[Match]:
    """Every way `pattern` fits with `root` as the node producing the pattern's result (its
    first output); the match's first member is then `root`."""
    if root.outputs:
        yield from pattern.match(root.outputs[0], Match())
