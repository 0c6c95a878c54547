"""The compiler layer: the pass pipeline, its context and the stages around it.

`pipeline` lists the passes (passes/, one per file) in order and assembles the plan from what they
record; `context` is the CompileContext they share (with the Options, rkcompile/options.py); `int8_choice` and
`auto_float16` choose int8 settings and float16 islands, a stage after the shared front half
(`context.Runtime` states what they ask of the runtime the caller passes in: calibration,
judging candidates); `cost_estimate` counts what a step does; `idle_npu` refuses plans that would leave
the NPU idle. It reads targets (targets/) and writes plans (rkcompile.plan); it never imports the
emulator, nor do passes/ and targets/ (tests/test_layering.py).
"""
