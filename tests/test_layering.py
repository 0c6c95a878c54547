"""The layers show in the imports (issue 16), checked over the import graph of rkcompile/,
passes/ and targets/ as the source states it: every `import` and `from ... import`, at module
level or inside a function, parsed with ast (nothing is imported to check).

- Plan data (rkcompile/plan/schema.py and what it needs) and the emulator import nothing of the
  compiler: no pass, not the IR module, the pipeline or the compile context.
- The runtime (rkcompile.emulator, with the CPU backends' module rkcompile.onnx_backends) and the
  plan layer (rkcompile.plan) import no module of the IR layer, the compiler or the passes
  themselves, and not onnx_graphsurgeon: a saved plan's nodes are the plan layer's plain nodes.
- The targets, which the runtime asks for a SoC's figures (its C2), import neither
  onnx_graphsurgeon nor the IR: their constraint checks read what any node has. A saved plan
  loads and runs in a fresh process without onnx_graphsurgeon or any compiler module.
- Views read plans: they import nothing of the compiler either.
- No import circles.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
#: installed package name -> folder in the repository (pyproject.toml's package-dir)
PACKAGES = {"rkcompile": REPO / "rkcompile", "rkcompile.passes": REPO / "passes", "rkcompile.targets": REPO / "targets"}

#: The plan-data layer: the contract and what reading, checking and laying out a plan needs.
PLAN_DATA = ("rkcompile.plan.schema", "rkcompile.plan.artifact", "rkcompile.plan.allocation", "rkcompile.numerics",
             "rkcompile.quantization.params", "rkcompile.errors", "rkcompile.plan.operations", "rkcompile.plan.plain_nodes",
             "rkcompile.plan.onnx_protos", "rkcompile.plan.cpu_partitions")
EMULATOR = "rkcompile.emulator"
VIEWS = ("rkcompile.views.summary", "rkcompile.views.graphviz", "rkcompile.views.html_report", "rkcompile.views.partition_view",
         "rkcompile.views.partitioned_onnx", "rkcompile.views.charts", "rkcompile.views.standard_onnx",
         "rkcompile.views.toolkit_shapings", "rkcompile.views.qdq", "rkcompile.views.proto_graph",
         "rkcompile.views.host_tail",
         "rkcompile.views.perf", "rkcompile.views.partition_graph")
COMPILER = ("rkcompile.passes", "rkcompile.ir.graph", "rkcompile.compiler.pipeline", "rkcompile.compiler.context")
#: what the runtime and the plan layer import nothing of, not even one module
RUNTIME = ("rkcompile.emulator", "rkcompile.plan", "rkcompile.onnx_backends")
NOT_FOR_THE_RUNTIME = ("rkcompile.ir", "rkcompile.compiler", "rkcompile.passes")


def module_files() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The rkcompile modules `module` imports, as written in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import name` imports the submodule pkg.name when there is one
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def outside_imports(path: Path) -> set[str]:
    """The packages outside rkcompile a module's source imports, by their top-level name
    (`import onnx_graphsurgeon as gs` and `from onnx_graphsurgeon.ir import tensor` both give
    onnx_graphsurgeon); relative imports are rkcompile's own."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module.partition(".")[0])
    return found - {"rkcompile"}


def direct_imports(graph: nx.DiGraph, sources: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    """Each import of a module in `forbidden` written in a module of `sources`."""
    return [f"{module} -> {imported}" for module, imported in graph.edges
            if in_layer(module, sources) and in_layer(imported, forbidden)]


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    files = module_files()
    known = set(files)
    dag = nx.DiGraph()
    dag.add_nodes_from(known)
    for module, path in files.items():
        dag.add_edges_from((module, imported) for imported in imports_of(module, path, known))
    return dag


def in_layer(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def forbidden_paths(graph: nx.DiGraph, sources: list[str], forbidden: tuple[str, ...]) -> list[str]:
    """One import chain from each source to each forbidden module it reaches."""
    found = []
    for source in sources:
        reached = nx.single_source_shortest_path(graph, source)
        found += [" -> ".join(chain) for target, chain in reached.items() if in_layer(target, forbidden)]
    return found


def test_the_import_graph_is_read(graph):
    assert {"rkcompile.plan.schema", "rkcompile.emulator.executor", "rkcompile.passes.fuse", "rkcompile.targets.rk3588"} <= \
        set(graph.nodes)
    assert ("rkcompile.compiler.pipeline", "rkcompile.passes.fuse") in graph.edges


def test_plan_data_and_the_emulator_import_nothing_of_the_compiler(graph):
    sources = [m for m in graph.nodes if in_layer(m, PLAN_DATA) or in_layer(m, EMULATOR)]
    assert len(sources) > 10
    assert forbidden_paths(graph, sources, COMPILER) == []


def test_the_runtime_and_the_plan_layer_import_no_onnx_graphsurgeon():
    modules = {module: path for module, path in module_files().items() if in_layer(module, RUNTIME)}
    assert len(modules) > 20
    assert sorted(module for module, path in modules.items() if "onnx_graphsurgeon" in outside_imports(path)) == []


def test_the_runtime_and_the_plan_layer_import_no_module_of_the_ir_or_the_compiler(graph):
    assert direct_imports(graph, RUNTIME, NOT_FOR_THE_RUNTIME) == []


TARGETS = "rkcompile.targets"


def test_the_targets_import_no_onnx_graphsurgeon_and_no_ir(graph):
    modules = {module: path for module, path in module_files().items() if in_layer(module, TARGETS)}
    assert len(modules) > 10
    assert sorted(module for module, path in modules.items() if "onnx_graphsurgeon" in outside_imports(path)) == []
    assert direct_imports(graph, (TARGETS,), ("rkcompile.ir",)) == []


#: A fresh process loads a saved plan and runs it, then names what it output and which modules of
#: the compiler's side it loaded
RUN_SAVED_PLAN = """
import json, sys
import rkcompile
outputs = rkcompile.run(rkcompile.load(sys.argv[1]))
loaded = sorted(m for m in sys.modules if m == 'onnx_graphsurgeon' or m.startswith(('onnx_graphsurgeon.', *sys.argv[2:])))
print(json.dumps({'outputs': {name: list(value.shape) for name, value in outputs.items()}, 'loaded': loaded}))
"""


def test_a_saved_plan_runs_without_onnx_graphsurgeon_or_the_compiler(tmp_path):
    import rkcompile

    saved = rkcompile.compile(REPO / "examples" / "tiny_cnn.onnx", target="rk3588").save(tmp_path / "tiny.rkplan")
    done = subprocess.run([sys.executable, "-c", RUN_SAVED_PLAN, str(saved), *NOT_FOR_THE_RUNTIME],
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["outputs"] == {"logits": [1, 10]}
    assert report["loaded"] == []


def test_views_read_plans_and_import_nothing_of_the_compiler(graph):
    """The pictures, the summary and the partitioned ONNX draw a plan, fresh or loaded from a
    file: no pass, no pipeline, and not the compile context or the IR it holds."""
    assert forbidden_paths(graph, list(VIEWS), COMPILER) == []


def test_no_import_circles(graph):
    assert list(nx.simple_cycles(graph)) == []


def test_a_forbidden_import_is_caught(graph, tmp_path):
    """The checks see a violation: the emulator's storage importing a pass, as it once did."""
    broken = graph.copy()
    broken.add_edge("rkcompile.emulator.storage", "rkcompile.passes.layout")
    assert "rkcompile.emulator.executor -> rkcompile.emulator.storage -> rkcompile.passes.layout" in \
        forbidden_paths(broken, ["rkcompile.emulator.executor"], COMPILER)
    assert forbidden_paths(graph, ["rkcompile.emulator.executor"], COMPILER) == []
    source = tmp_path / "module.py"
    source.write_text("def f():\n    from rkcompile.passes.layout import as_nchw\n")
    assert imports_of("rkcompile.emulator.fake", source, set(graph.nodes)) == {"rkcompile.passes.layout"}
    # the runtime's own checks: an IR helper imported directly, onnx_graphsurgeon in any form
    broken.add_edge("rkcompile.emulator.fused", "rkcompile.ir.nodes")
    assert "rkcompile.emulator.fused -> rkcompile.ir.nodes" in direct_imports(broken, RUNTIME, NOT_FOR_THE_RUNTIME)
    source.write_text("import numpy as np\nfrom . import storage\n\ndef f():\n"
                      "    from onnx_graphsurgeon.ir import tensor\n")
    assert outside_imports(source) == {"numpy", "onnx_graphsurgeon"}


#: The compiler's packages: planning imports no runtime. An int8 plan's calibration and its
#: candidates run on the runtime the caller passes in (rkcompile/compiler/context.py).
COMPILER_PACKAGES = ("rkcompile.passes", "rkcompile.targets", "rkcompile.compiler")


def test_the_compiler_imports_nothing_of_the_emulator(graph):
    sources = [m for m in graph.nodes if in_layer(m, COMPILER_PACKAGES)]
    assert len(sources) > 30
    assert forbidden_paths(graph, sources, (EMULATOR,)) == []


def test_a_compiler_import_of_the_emulator_is_caught(graph):
    """Through another module too: a pass importing a neutral module that imports the emulator."""
    broken = graph.copy()
    broken.add_edge("rkcompile.onnx_backends", "rkcompile.emulator.reference")
    assert "rkcompile.passes.rewrites.resize_as_matmul -> rkcompile.onnx_backends -> rkcompile.emulator.reference" in \
        forbidden_paths(broken, ["rkcompile.passes.rewrites.resize_as_matmul"], (EMULATOR,))
    assert forbidden_paths(graph, ["rkcompile.passes.rewrites.resize_as_matmul"], (EMULATOR,)) == []
