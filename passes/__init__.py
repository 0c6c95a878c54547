"""The compiler passes, one per module. Each exposes `NAME` and `run(ctx: CompileContext) -> None`;
rkcompile.pipeline lists them in order."""
