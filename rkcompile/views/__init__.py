"""The views layer: what a user reads or looks at, drawn from a plan alone.

`summary` is the text summary, `partition_view` what the pictures show, `graphviz`,
`html_report` and `charts` the DOT/SVG/HTML pictures, `partitioned_onnx` a partitioned ONNX for
Netron, `ops_doc` the SUPPORTED_OPS pages and `--explain` text. Views read plans and targets;
they import nothing of the compiler.
"""
