"""The CPU side of the emulator: CPU steps run on onnxruntime, the runtime users trust and the
one `rkcompile run --check` compares with; onnx.reference only runs what onnxruntime cannot
(an op or a type it has no kernel for, or computes against the spec: ONNXRUNTIME_DEVIATIONS),
and is what NPU kernels in `kernels/reference_ops.py`
or a kernel's `Unsupported` case fall back to, in float32.

Every function here returns one value per node output, in the node's output order, None for an
omitted optional output (name ''): onnx.reference and onnxruntime return only the named ones,
and pairing those by position would hand Y_h's value to an omitted Y.

Which backend a CPU step runs on is decided when the plan is made (rkcompile/onnx_backends.py
`cpu_backend`, recorded as the step's `cpu_backend`): it has no kernel for an op, domain or
input type, and onnx.reference runs the step instead.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from rkcompile.emulator.storage import EmulationError
from rkcompile.onnx_backends import (ONNXRUNTIME, anonymous, anonymous_key, anonymous_names, cpu_backend,
    make_session, node_model, reference_has)
from rkcompile.plan.plain_nodes import Node, node_operands, subgraphs
from rkcompile.plan.onnx_protos import single_node_graph


def by_output(node: Node, named: Sequence[np.ndarray]) -> list[np.ndarray | None]:
    """A runtime's results (one per named output) lined up with all the node's outputs."""
    results = iter(named)
    return [runtime_value(next(results)) if t.name else None for t in node.outputs]


def runtime_value(value) -> np.ndarray | list | None:
    """A value as the emulator holds it: an array; a sequence as a list of arrays (its tensors
    may differ in shape: SplitToSequence with uneven parts); an empty optional as None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [np.asarray(item) for item in value]
    return np.asarray(value)


def run_reference(node: Node, inputs: Sequence[np.ndarray | None], opset: int,
                  opsets: Mapping[str, int] | None = None) -> list[np.ndarray | None]:
    from onnx.reference import ReferenceEvaluator  # here: 0.1 s to import, and most plans never need it

    feeds = {t.name: value for t, value in zip(node_operands(node), inputs) if t.name}
    evaluator = ReferenceEvaluator(single_node_graph(node), opsets={**(opsets or {}), "": opset})
    try:
        return by_output(node, evaluator.run(None, feeds))
    except ImportError as exc:  # an op whose implementation needs an optional package (ImageDecoder: Pillow)
        raise EmulationError(f"onnx.reference needs the Python package {exc.name or exc} to run {node.op} "
                             f"node {node.name}, and onnxruntime cannot run it") from None


def feeds_signature(feeds: Mapping[str, np.ndarray]) -> tuple:
    """What a session depends on in its feeds: their names, dtypes and shapes."""
    return tuple(sorted((name, value.dtype.str, value.shape) for name, value in feeds.items()))


def session_for_feeds(sessions: dict, feeds: Mapping[str, np.ndarray], make: Callable[[Mapping[str, np.ndarray]], object]):
    """The session `make(feeds)` gives for feeds of these names, dtypes and shapes, made once per
    such signature and kept in `sessions` (None, kept too, where onnxruntime refused the model)."""
    key = feeds_signature(feeds)
    if key not in sessions:
        sessions[key] = make(feeds)
    return sessions[key]


class CpuRuntime:
    """Runs CPU nodes on the backend their step names, keeping one onnxruntime session per node
    and input types for every later run of the same prepared plan; nodes alike but for their
    tensors' names (`anonymous_key`, attribute values included) share one."""

    def __init__(self, opset: int, opsets: Mapping[str, int]):
        self.opset = opset
        self.opsets = {**opsets, "": opset}
        self.sessions: dict[tuple, object] = {}
        self.backends: dict[str, str | None] = {}

    def backend_of(self, node: Node) -> str | None:
        """`cpu_backend` for a node no plan step names one for, decided once per node."""
        if node.name not in self.backends:
            self.backends[node.name] = cpu_backend(node, self.opsets)
        return self.backends[node.name]

    def run(self, node: Node, inputs: Sequence[np.ndarray | None], backend: str,
            fallbacks: list[str]) -> list[np.ndarray | None]:
        """The node's outputs; when onnxruntime fails on these values (a case the plan-time check
        could not foresee: a subgraph's shapes, a runtime error) and onnx.reference has the op,
        that computes it and `fallbacks` says so."""
        if backend != ONNXRUNTIME:
            return run_reference(node, inputs, self.opset, self.opsets)
        if any(isinstance(v, list) for v in inputs):  # a sequence: onnx.reference takes it as a list
            return self._instead(node, inputs, "a sequence input", fallbacks)
        present = [(t, np.asarray(v)) for t, v in zip(node_operands(node), inputs) if t.name]
        dtypes = [v.dtype for _, v in present]
        shapes = [v.shape for _, v in present] if subgraphs(node) else None
        # nodes that differ only in their tensors' names (an IsNaN per attention layer) share
        # one session of the node renamed by position: the same function on the same types,
        # and a session made once instead of once per step (0.3-0.6 ms each on a first run)
        shared = anonymous_key(node, dtypes, self.opsets, value_blind=False) if shapes is None else None
        names = anonymous_names([t.name for t in node.inputs], [t.name for t in node.outputs]) if shared else {}
        key = ("anonymous", shared) if shared else (node.name, node.op, tuple(d.str for d in dtypes),
                                                    shapes and tuple(shapes))
        session = self.sessions.get(key)
        if session is None:
            try:
                model = node_model(node, dtypes, self.opsets, shapes)
                session = self.sessions[key] = make_session(anonymous(model) if shared else model)
            except Exception as exc:  # noqa: BLE001  (onnx's shape inference and onnxruntime's own classes)
                return self._instead(node, inputs, f"no session: {str(exc).splitlines()[0]}", fallbacks)
        try:
            named = session.run(None, {names.get(t.name, t.name): v for t, v in present})
        except Exception as exc:  # noqa: BLE001  (onnxruntime's own error classes)
            return self._instead(node, inputs, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                                 fallbacks)
        return by_output(node, named)

    def _instead(self, node: Node, inputs: Sequence[np.ndarray | None], failure: str,
                 fallbacks: list[str]) -> list[np.ndarray | None]:
        """onnx.reference's outputs for a node onnxruntime failed on with these values."""
        if not reference_has(node, self.opsets):
            raise EmulationError(f"onnxruntime failed on {node.op} node {node.name}: {failure}")
        fallbacks.append(f"{node.op} {node.name}: onnxruntime failed ({failure})")
        try:
            return run_reference(node, inputs, self.opset, self.opsets)
        except EmulationError:
            raise
        except Exception as second:  # noqa: BLE001  (onnx.reference's own error classes)
            raise EmulationError(f"onnxruntime failed on {node.op} node {node.name} ({failure}), and so did "
                                 f"onnx.reference ({str(second).splitlines()[0] if str(second) else ''})") from None
