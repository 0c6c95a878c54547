"""The views layer: what a user reads or looks at, drawn from a plan alone.

`summary` is the text summary, `partition_view` what the pictures show, `graphviz`,
`html_report` and `charts` the DOT/SVG/HTML pictures, `partitioned_onnx` a partitioned ONNX for
Netron, `standard_onnx` the plan's graph as standard ONNX for rknn-toolkit2 (`rkcompile export`; its
`toolkit_shapings`, its int8 `qdq` pairs, and the `proto_graph` helpers they share),
`perf` the per-step estimate table, `partition_graph` the partitions as a networkx graph,
`ops_doc` the SUPPORTED_OPS pages and `--explain` text. Views read plans and targets;
they import nothing of the compiler.
"""
