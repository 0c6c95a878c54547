"""The IR layer: the compiler's mutable graph (onnx-graphsurgeon) and what it needs to work on it.

`graph` holds graph-level helpers (readers, producers, topological order, shape models), `nodes`
facts about one node or tensor and its conversion to the plan layer's plain node, `describe` a
node as a plan's operation record, `edits` the one graph-edit helper every pass shares (replace
uses, detach), `dag` the analysis graph for cycles and convexity, `patterns` the dataflow-pattern
language the fusion table is written in. Only the compiler (rkcompile.compiler, passes/,
targets/) imports this layer; plans and the emulator never do.
"""
