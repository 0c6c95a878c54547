"""The compiler passes, one per module. Each exposes `NAME` and `run(ctx: CompileContext) -> None`;
rkcompile.compiler.pipeline lists them in order."""
