"""The plan layer: an execution plan as data, and everything that reads or checks it alone.

`schema` is the versioned plan contract (rkcompile.plan/2: frozen records, JSON in and out,
invariants), `artifact` the .rkplan file, `operations` each step's node rebuilt from plan data,
`plain_nodes` the plain node it is rebuilt as, `onnx_protos` such nodes as ONNX protos, `allocation`
the arena planner and its checker, `cost_model` the roofline time of a step, `cpu_partitions`
the CPU partitions as standalone ONNX models. Nothing here imports the compiler, the emulator
or onnx-graphsurgeon: a saved plan is all it needs.
"""
