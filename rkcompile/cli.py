"""The `rkcompile` command line."""
from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

from rkcompile import __version__
from rkcompile.collector import cyclic_collector_paused
from rkcompile.errors import CompileError

if TYPE_CHECKING:
    from rkcompile.options import Options


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME:d0,d1,... but got '{text}'")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"dims of '{name}' must be integers, got '{dims}'") from None
    if any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"dims of '{name}' must be positive, got '{dims}'")
    return name, shape


def _numbers(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got '{text}'") from None
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of 0 or more, got '{text}'") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of 0 or more, got '{text}'")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one `error: ...` line like every other failure."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With `command` (one of the subcommands), only that subcommand
    gets its arguments; the others keep their name, help line and description, which is all the
    top-level help, a usage error and parsing `command`'s arguments read. Building the other
    subcommands' arguments (5-10 ms) and importing what their choices come from is start-up
    time a plan process would pay for nothing (tools/bench_plan.py)."""
    parser = _Parser(prog="rkcompile", description="Plan ONNX models for Rockchip RKNPU2 NPUs.")
    parser.add_argument("--version", action="version", version=f"rkcompile {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each pass and every CPU fallback")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_line, description, add_arguments) in _SUBCOMMANDS.items():
        subcommand = commands.add_parser(name, help=help_line, description=description)
        # -v after the subcommand too; SUPPRESS keeps a -v before it from being reset
        subcommand.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                help="log each pass and every CPU fallback")
        if command is None or command == name:
            add_arguments(subcommand)
    return parser


def command_named(argv: list[str]) -> str | None:
    """The subcommand `argv` names, None when it names none: the first argument that is not an
    option, as the top-level options (-v, --version, -h) take no value."""
    name = next((argument for argument in argv if not argument.startswith("-")), None)
    return name if name in _SUBCOMMANDS else None


def _target_names() -> str:
    from rkcompile.targets import TARGET_MODULES

    return ", ".join(TARGET_MODULES)  # named as their targets: the help builds no target


def _plan_arguments(plan: argparse.ArgumentParser) -> None:
    from rkcompile.passes.multicore import CORE_MASKS
    from rkcompile.compiler.pipeline import PASS_NAMES

    _add_model_arguments(plan)
    plan.add_argument("--json", type=Path, metavar="PATH", help="write the plan (rkcompile.plan/2) to PATH")
    plan.add_argument("-o", "--output", type=Path, metavar="PLAN.rkplan",
                      help="write the plan artifact (plan.json and the weight region, docs/plan-schema.md) to "
                           "PLAN.rkplan; `rkcompile run --plan PLAN.rkplan` executes it without the model")
    plan.add_argument("--dump-after", action="append", default=[], choices=PASS_NAMES, metavar="PASS",
                      help=f"write the graph as ONNX after PASS ({', '.join(PASS_NAMES)}); repeatable")
    plan.add_argument("--dump-dir", type=Path, default=Path("."), help="folder for --dump-after files (default .)")
    plan.add_argument("--core-mask", default="auto", choices=CORE_MASKS, metavar="MASK",
                      help=f"NPU cores for one input ({'|'.join(CORE_MASKS)}; default auto): steps whose kernel "
                           "is multi-core on the target split across them; with --batch > 1 leave it auto")
    plan.add_argument("--csv", type=Path, metavar="PATH",
                      help="also write the summary's figures to PATH as CSV, a header and one row (as Arm's vela "
                           "writes its summary CSV)")
    plan.add_argument("--quiet", action="store_true", help="print no summary")
    plan.add_argument("--strict", action="store_true",
                      help="fail, writing no plan, when any node falls back to the CPU; lists each node's reasons")
    plan.add_argument("--explain", metavar="NODE",
                      help="print every rule checked for NODE (a node name of the input model), pass or fail")


def _ops_arguments(ops: argparse.ArgumentParser) -> None:
    ops.add_argument("--target", required=True, help=f"the SoC ({_target_names()})")
    ops.add_argument("--format", default="md", choices=OPS_FORMATS, help="Markdown or plain text (default md)")
    ops.add_argument("-o", "--output", type=Path, metavar="OUT", help="write to OUT instead of printing")


def _graph_arguments(graph: argparse.ArgumentParser) -> None:
    _add_model_arguments(graph, saved_plan=True)
    graph.set_defaults(dtype=None, batch=None)  # None: not given, so a saved plan's own values hold
    graph.add_argument("--format", choices=GRAPH_FORMATS,
                       help="what to write (default: from OUT's suffix, .dot/.gv, .svg, .html/.htm, .onnx or "
                            ".graphml)")
    graph.add_argument("-o", "--output", required=True, type=Path, metavar="OUT",
                       help="the file to write ('-' for standard output, with --format)")


def _perf_arguments(perf: argparse.ArgumentParser) -> None:
    _add_model_arguments(perf, saved_plan=True)
    perf.set_defaults(dtype=None, batch=None)  # None: not given, so a saved plan's own values hold
    perf.add_argument("--csv", type=Path, metavar="PATH",
                      help="also write the rows to PATH as CSV, one a step (as Arm's vela writes its per-layer CSV)")


def _compare_arguments(compare: argparse.ArgumentParser) -> None:
    _add_model_arguments(compare, target_help="the SoCs to plan for: 'all', or a comma list")
    compare.add_argument("--json", type=Path, metavar="PATH", help="also write the rows as JSON to PATH ('-': "
                                                                   "standard output, the table then on standard error)")


def _run_arguments(run: argparse.ArgumentParser) -> None:
    _add_model_arguments(run, model_optional=True)
    run.set_defaults(dtype=None, batch=None)  # None: not given, so a saved artifact's own values hold
    run.add_argument("--plan", type=Path, metavar="PLAN",
                     help="execute this saved plan: a PLAN.rkplan artifact needs no MODEL (given one, it must "
                          "be the model planned); a plan JSON file is checked against MODEL planned afresh")
    run.add_argument("--inputs", type=Path, metavar="X.npz|X.npy|IMAGE",
                     help="input arrays: an .npz keyed by graph input name (and, for --check, reference outputs "
                          "by output name; inputs it lacks are seeded random, keys the model does not name are "
                          "refused), one .npy array for a single-input model, or an image (png, jpg, bmp; with "
                          "Pillow) read as --calib reads one, with --mean-values, --std-values and --channel-order")
    run.add_argument("--outputs", type=Path, metavar="OUT.npz", help="write the outputs keyed by graph output name "
                     "(a sequence output as NAME[0], NAME[1], ...)")
    run.add_argument("--check", action="store_true",
                     help="compare with the reference arrays in --inputs, else with onnxruntime; "
                          "exit 1 below --min-cosine")
    run.add_argument("--min-cosine", type=float, default=None,
                     help="--check tolerance (default 0.9999 for float16, 0.99 for int8)")
    run.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    run.add_argument("--json", type=Path, metavar="REPORT", help="write a JSON report to REPORT")
    run.add_argument("--accuracy-analysis", action="store_true",
                     help="print each step's cosine against the planned graph run in float32, and the worst "
                          "steps (for --dtype int8; rknn-toolkit2's accuracy_analysis)")


def _zoo_arguments(zoo: argparse.ArgumentParser) -> None:
    zoo.add_argument("folder", type=Path, metavar="DIR", help="folder searched recursively for .onnx files")
    zoo.add_argument("--target", action="append", metavar="T",
                     help=f"a SoC to plan for, repeatable (default rk3588; {_target_names()})")
    zoo.add_argument("--jobs", type=_positive, metavar="N", help="worker processes (default: the CPUs available)")
    zoo.add_argument("--scheduler", metavar="ADDRESS",
                     help="run the jobs on the Dask distributed cluster whose scheduler is at ADDRESS "
                          "(tcp://HOST:8786) instead of local processes; needs pip install 'rkcompile[dask]', and "
                          "the workers must see DIR at the same path (docs/zoo.md)")
    zoo.add_argument("--run", action="store_true",
                     help="also emulate each plan and measure the worst output cosine (against NAME.npz "
                          "beside the model, else onnxruntime)")
    zoo.add_argument("--json", type=Path, metavar="OUT", help="write every row, diff and timing to OUT")
    zoo.add_argument("--golden", type=Path, metavar="GOLDEN_DIR", help="compare with the summaries in GOLDEN_DIR")
    zoo.add_argument("--update-golden", action="store_true", help="write this run's summaries to GOLDEN_DIR")
    zoo.add_argument("--arena-tolerance", type=float, default=0.02, metavar="FRACTION",
                     help="arena growth that is still no regression (default 0.02)")
    zoo.add_argument("--min-cosine", type=float, default=0.9999,
                     help="a worst cosine below this (and below the golden's) is a regression (default 0.9999)")


def _freeze_input(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE but got '{text}'")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the value of '{name}' must be a number, got '{value}'") from None


def _export_arguments(export: argparse.ArgumentParser) -> None:
    _add_model_arguments(export)
    export.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.onnx",
                        help="the ONNX file to write; its report goes to OUT.report.json beside it")
    export.add_argument("--freeze-input", type=_freeze_input, action="append", default=[], metavar="NAME=VALUE",
                        help="plan with input NAME fixed to VALUE (filling its shape), so what it selects folds "
                             "away (an If on a sample rate); the file no longer has that input; repeatable")
    export.add_argument("--inputs", type=Path, metavar="X.npz",
                        help="check the export on these input arrays, keyed by input name (keys naming outputs "
                             "are ignored; inputs it lacks are seeded random)")
    export.add_argument("--seed", type=int, default=0, help="seed for the check's random inputs (default 0)")
    export.add_argument("--tolerance", type=_non_negative, metavar="FRACTION",
                        help="the largest difference from MODEL on onnxruntime the check accepts, as a fraction of "
                             "each output's largest magnitude (default 2^-10; a float plan's)")
    export.add_argument("--host-tail", action="store_true",
                        help="a graph with shapes the data decides (a detector's NMS): write its static part to "
                             "OUT.onnx for the toolkit and the rest to OUT.host.onnx for onnxruntime on the host, "
                             "checked together against MODEL; an output the toolkit would reshape on its CPU "
                             "(a YOLO head's [1, 84, 2100]) is written 4-D and reshaped in OUT.host.onnx")


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """`targets` takes no arguments of its own."""


def _add_model_arguments(parser: argparse.ArgumentParser, model_optional: bool = False, saved_plan: bool = False,
                         target_help: str = "the SoC to plan for") -> None:
    """What every command that plans a model takes (`run` can take a saved plan instead, and
    `graph` a saved plan as MODEL)."""
    from rkcompile.options import CHOOSE
    from rkcompile.plan.schema import CHANNEL_ORDERS

    parser.add_argument("model", type=Path, nargs="?" if model_optional else None,
                        help="the ONNX model file, or a saved plan (PLAN.rkplan or plan JSON)" if saved_plan
                        else "the ONNX model file")
    parser.add_argument("--target", required=not (model_optional or saved_plan),
                        help=f"{target_help} ({_target_names()})"
                             + ("; a saved plan has its own" if saved_plan else ""))
    parser.add_argument("--dtype", default="float16", choices=["float16", "int8"],
                        help="NPU compute dtype (default float16); int8 is calibrated with --calib")
    parser.add_argument("--calib", type=Path, metavar="PATH",
                        help="int8 calibration inputs: a folder of .npy/.npz files or images (png, jpg, bmp; "
                             "with Pillow), one such file (an .npz keyed by input name), or a dataset.txt listing "
                             "one sample a line (its .npy or image files, one per input, in input order) "
                             "(default: a few seeded random inputs, with a warning)")
    parser.add_argument("--val", type=Path, metavar="PATH",
                        help="int8: inputs kept out of --calib, in its formats, to judge the plan on: the summary's "
                             "validation cosine per output (the worst over them; the plan JSON's `validation`), and "
                             "the samples --auto-float16 meets its target on")
    parser.add_argument("--mean-values", type=_numbers, metavar="M[,M,M]",
                        help="calibration images: subtract these per channel, in --channel-order, before dividing "
                             "by --std-values (rknn-toolkit2's mean_values, e.g. 123.675,116.28,103.53; default 0)")
    parser.add_argument("--std-values", type=_numbers, metavar="S[,S,S]",
                        help="calibration images: divide by these per channel (rknn-toolkit2's std_values, e.g. "
                             "58.395,57.12,57.375 or 255; default 1)")
    parser.add_argument("--channel-order", choices=CHANNEL_ORDERS,
                        help="calibration images: the channel order the model takes (images decode as RGB; BGR "
                             "reverses them, rknn-toolkit2's quant_img_RGB2BGR) (default RGB)")
    parser.add_argument("--calib-method", choices=(*CALIBRATION_METHODS, CHOOSE),
                        help="int8 activation ranges: min/max, 0.01-99.99 percentiles, KL, or mmse (the clip of "
                             f"least quantization MSE per tensor); {CHOOSE} (the default): minmax or mmse, "
                             "whichever judges better on the calibration data (docs/quantization.md)")
    parser.add_argument("--float16", action="append", default=[], metavar="TENSOR",
                        help="int8 hybrid quantization: the NPU step writing TENSOR computes in float16, or, "
                             "for a model input's NPU copy NAME@npu, the input reaches the NPU as float16; repeat "
                             "for several (run --accuracy-analysis lists the steps' outputs)")
    parser.add_argument("--auto-float16", type=float, metavar="COSINE",
                        help="int8: compute the fewest NPU steps in float16 so that the outputs reach COSINE "
                             "against the float32 graph on every calibration sample (or the all-float16 plan's "
                             "cosine when lower); the summary lists them with their estimated cost")
    for flag, what in (("equalization", "cross-layer equalization of Conv -> Conv pairs before calibration"),
                       ("bias-correction", "Conv biases absorb the mean shift of their rounded int8 weights")):
        parser.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None,
                            help=f"int8: {what} (default: on or off, whichever judges better on the calibration "
                                 f"data; docs/quantization.md)")
    parser.add_argument("--batch", type=_positive, default=1, help="batch size (default 1)")
    parser.add_argument("--input-shape", type=_input_shape, action="append", default=[], metavar="NAME:DIMS",
                        help="fix an input's shape, e.g. images:1,3,640,640; repeat for several inputs")
    parser.add_argument("--verify-passes", action="store_true",
                        help="check the graph's invariants and each pass's contract after every pass "
                             "(debugging; also RKCOMPILE_VERIFY_PASSES=1): a pass that breaks one fails by name")


#: subcommand -> its help line, its description (None: argparse's default, the help line's
#: absence) and what adds its arguments; the order is the help's
_SUBCOMMANDS: dict[str, tuple[str, str | None, Callable[[argparse.ArgumentParser], None]]] = {
    "plan": ("plan a model for a target and print a summary",
             "Plan MODEL for an RKNPU2 target: placement, partitions, memory.", _plan_arguments),
    "targets": ("list the targets and their figures", None, _no_arguments),
    "ops": ("print a target's supported operators and their rules",
            "Render the SUPPORTED_OPS document of a target from the rules legalize enforces.", _ops_arguments),
    "graph": ("draw the partition graph of a plan",
              "Plan MODEL (or read a saved plan) and write its partition graph: Graphviz DOT, SVG (needs "
              "Graphviz's dot), a self-contained HTML page with the memory and time pictures, an ONNX file with "
              "one rkcompile::NpuPartition node per NPU partition, GraphML of the partitions and steps with their "
              "device, kernel, tensors, bytes and estimated time (Plan.partition_graph), or one of the two pictures "
              "as SVG: the arena "
              "over the steps (memory-svg) or the per-core timeline of an estimated run (timeline-svg).",
              _graph_arguments),
    "perf": ("print each step's estimated time and share of the run",
             "Plan MODEL (or read a saved plan) and print one row per step, as rknn-toolkit2's eval_perf: device, "
             "kernel, nodes, MACs, bytes read and written, the cost model's estimated microseconds and share of "
             "the run (docs/cost-model.md); the totals are the summary's estimate.", _perf_arguments),
    "compare": ("plan a model for several SoCs and print one table",
                "Plan MODEL for each target and print one row per SoC: NPU share of the ops, CPU ops, steps, "
                "arena, weights and estimated fps (docs/cost-model.md). A target that cannot take the model gets "
                "a row saying why.", _compare_arguments),
    "run": ("execute a plan on the numpy emulator and check its outputs",
            "Plan MODEL (or load a saved plan) and execute the plan on the numpy emulator: arena offsets, "
            "NC1HWC2, float16 on the NPU, weights read from the weight region.", _run_arguments),
    "export": ("write the planned graph as standard ONNX for rknn-toolkit2",
               "Plan MODEL and write the graph the passes made of it (folded, simplified, legalized) as standard "
               "ONNX: fused kernels as their members, static shapes, opset <= 19. It is checked against MODEL on "
               "onnxruntime first, and written only if they agree (docs/deploy.md).", _export_arguments),
    "zoo": ("plan (and emulate) every model of a folder, compare with goldens",
            "Plan every .onnx under FOLDER for each target in parallel processes, print a table, and compare "
            "with golden summaries; exit 1 on a regression (docs/zoo.md defines them).", _zoo_arguments),
}


def calibration_options(args: argparse.Namespace) -> dict:
    """The Options fields of --calib, --val, --calib-method, --float16 and the int8 techniques, which
    only an int8 plan uses, and of --verify-passes (not given: Options' default, from the
    environment)."""
    techniques = {name: value for name, value in (("equalization", args.equalization),
                                                  ("bias_correction", args.bias_correction),
                                                  ("auto_float16", args.auto_float16)) if value is not None}
    method = {} if args.calib_method is None else {"calibration_method": args.calib_method}
    images = {name: value for name, value in (("mean_values", args.mean_values), ("std_values", args.std_values),
                                              ("channel_order", args.channel_order)) if value is not None}
    # --calib-method minmax was the default once: a float16 plan still takes it
    if args.dtype != "int8" and (args.calib is not None or args.val is not None
                                 or args.calib_method not in (None, "minmax") or args.float16 or techniques or images):
        raise CompileError("--calib, --val, --calib-method, --mean-values, --std-values, --channel-order, --float16, "
                           "--auto-float16, --equalization and --bias-correction apply to int8 plans; add --dtype int8")
    return {"calibration": args.calib, "validation": args.val,
            "float16_tensors": tuple(args.float16), **method, **techniques, **images,
            **({"verify_passes": True} if args.verify_passes else {})}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return _execute(build_parser(command_named(argv)).parse_args(argv))


def _execute(args: argparse.Namespace) -> int:
    """Run the parsed command: its exit code, every failure one `error: ...` line."""
    import logging

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return _COMMANDS[args.command](args)
    except CompileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug in rkcompile: still one line, and a hint how to see more
        if args.verbose:
            raise
        print(f"error: internal error ({type(exc).__name__}: {exc}); rerun with -v for a traceback",
              file=sys.stderr)
        return 3


def _plan(args: argparse.Namespace) -> int:
    from rkcompile.options import Options
    from rkcompile.compiler.idle_npu import refuse_idle_npu
    from rkcompile.plan.schema import STDOUT, write_atomically
    from rkcompile.progress import quiet
    from rkcompile.views.summary import render_summary

    shapes = dict(args.input_shape)
    to_stdout = [option for option, path in (("--json", args.json), ("--output", args.output))
                 if path is not None and str(path) == STDOUT]
    if len(to_stdout) > 1:
        raise CompileError("--json - and --output - both ask for standard output; send one to a file")
    if args.dump_after and args.dump_dir.exists() and not args.dump_dir.is_dir():
        raise CompileError(f"--dump-dir: {args.dump_dir} is a file, not a folder")
    options = Options(dtype=args.dtype, batch=args.batch, core_mask=args.core_mask, input_shapes=shapes,
                      dump_after=tuple(args.dump_after), dump_dir=args.dump_dir, **calibration_options(args))
    with quiet() if args.quiet else contextlib.nullcontext():
        # a plan only summarized is never run: its CPU steps' backends are left undecided
        plan, ctx = _compile(args.model, args.target, options,
                             cpu_backends=args.json is not None or args.output is not None)
    refuse_idle_npu(plan)
    explanation = None
    if args.explain is not None:
        from rkcompile.views.ops_doc import render_explanation

        explanation = render_explanation(ctx, plan, args.explain)
    fallbacks = [n for n in plan.nodes if n.device == "cpu"]
    if args.strict and fallbacks:
        listed = "\n".join(f"  {n.name} ({n.op}): {n.reason}" for n in fallbacks)
        raise CompileError(f"--strict: {len(fallbacks)} nodes fall back to the CPU on {plan.target}, "
                           f"no plan written\n{listed}")
    if args.json is not None:
        write_atomically(args.json, plan.to_json())
    if args.csv is not None:
        from rkcompile.views.perf import summary_csv

        write_atomically(args.csv, summary_csv(plan))
    if args.output is not None:  # what Plan.save writes, the reference weights included
        from rkcompile.api import plan_of

        plan_of(plan, ctx).save(args.output)
    # With the plan on standard output, what a person reads goes to standard error.
    text_stream = sys.stderr if to_stdout else sys.stdout
    if explanation is not None:
        print(explanation, file=text_stream)
    elif not args.quiet:
        print(render_summary(plan), file=text_stream)
    return 0


def _compile(model: Path, target: str, options: Options, cpu_backends: bool):
    """The plan and its compile context. The emulator is imported here, as the plan needs it:
    only an int8 plan runs on it (its calibration, its candidate plans), and importing the API
    and the emulator would cost every other plan's process that time for nothing
    (tools/bench_plan.py). `cpu_backends`: as `pipeline.compile_model`'s."""
    from rkcompile.compiler.pipeline import compile_model

    runtime = None
    if options.dtype == "int8":
        from rkcompile.api import EMULATOR_RUNTIME

        runtime = EMULATOR_RUNTIME
    return compile_model(model, target, options, cpu_backends=cpu_backends, runtime=runtime, choose_int8=True)


def _targets(args: argparse.Namespace) -> int:
    from rkcompile.targets import all_targets

    print(f"{'target':10} {'cores':>5} {'C2 int8':>8} {'C2 fp16':>8} {'NPU ops':>8} {'kernels':>8} "
          f"{'multi-core':>10}  {'aliases':14} {'oplist platform':16} description")
    for target in all_targets():
        c2 = {dtype: target.c2.get(dtype) or "-" for dtype in ("int8", "float16")}
        print(f"{target.name:10} {target.npu_cores:>5} {c2['int8']:>8} {c2['float16']:>8} "
              f"{len(target.ops):>8} {len(target.kernels):>8} {len(target.multi_core_kernels):>10}  "
              f"{', '.join(target.aliases) or '-':14} {target.oplist_platform:16} {target.description}")
    return 0


def _ops(args: argparse.Namespace) -> int:
    from rkcompile.views.ops_doc import render_supported_ops
    from rkcompile.plan.schema import write_atomically
    from rkcompile.targets import get_target

    document = render_supported_ops(get_target(args.target), args.format)
    if args.output is not None:
        write_atomically(args.output, document)
    else:
        print(document, end="")
    return 0


GRAPH_FORMATS = ("dot", "svg", "html", "onnx", "graphml", "memory-svg", "timeline-svg")
#: `graph -o OUT` without --format: the format OUT's suffix names
GRAPH_SUFFIXES = {".dot": "dot", ".gv": "dot", ".svg": "svg", ".html": "html", ".htm": "html", ".onnx": "onnx",
                  ".graphml": "graphml"}
CALIBRATION_METHODS = ("minmax", "percentile", "kl", "mmse")  # rkcompile/quantization/params.py METHODS
OPS_FORMATS = ("md", "text")


def _graph(args: argparse.Namespace) -> int:
    graph_format = args.format or GRAPH_SUFFIXES.get(args.output.suffix.lower())
    if graph_format is None:
        raise CompileError(f"--format: cannot tell the format from '{args.output}'; add --format "
                           f"({'|'.join(GRAPH_FORMATS)}) or name the file {', '.join(GRAPH_SUFFIXES)}")
    from rkcompile.compiler.idle_npu import refuse_idle_npu
    from rkcompile.plan.schema import write_atomically

    plan = _plan_to_draw(args)
    record = plan.record
    refuse_idle_npu(record)
    if graph_format == "onnx":
        from rkcompile.views.partitioned_onnx import partitioned_model

        nodes = plan.reference_nodes if plan.reference_nodes is not None else plan.step_nodes()
        write_atomically(args.output, partitioned_model(record, nodes).SerializeToString())
        return 0
    if graph_format == "graphml":  # Plan.partition_graph, for networkx, Gephi, yEd, Cytoscape
        import networkx

        write_atomically(args.output, "\n".join(networkx.generate_graphml(plan.partition_graph())) + "\n")
        return 0
    if graph_format in ("memory-svg", "timeline-svg"):
        from rkcompile.views.charts import memory_svg, timeline_svg

        write_atomically(args.output, (memory_svg if graph_format == "memory-svg" else timeline_svg)(record))
        return 0
    from rkcompile.views.partition_view import build_view

    view = build_view(record)
    if graph_format == "html":
        from rkcompile.views.html_report import to_html
        from rkcompile.views.summary import render_summary

        write_atomically(args.output, to_html(view, render_summary(record), record))
        return 0
    from rkcompile.views.graphviz import dot_to_svg, to_dot

    dot_source = to_dot(view)
    write_atomically(args.output, dot_to_svg(dot_source) if graph_format == "svg" else dot_source)
    return 0


def _plan_to_draw(args: argparse.Namespace):
    """The plan `graph` draws: MODEL planned now, or MODEL itself when it is a saved plan (an
    .rkplan artifact or a plan JSON file), which keeps the flags it was planned with."""
    import zipfile

    from rkcompile import api
    from rkcompile.options import Options
    from rkcompile.targets import get_target

    if zipfile.is_zipfile(args.model) or args.model.suffix.lower() == ".json":
        given = planning_flags(args)
        if given:
            raise CompileError(f"{args.model} is a saved plan, planned with its own flags: drop "
                               f"{', '.join(given)}")
        plan = api.load(args.model)
        if args.target is not None and get_target(args.target).name != plan.target:
            raise CompileError(f"--target {args.target}: {args.model} was planned for {plan.target}")
        return plan
    if args.target is None:
        raise CompileError("--target is required to plan an ONNX model (a saved plan has its own)")
    args.dtype, args.batch = args.dtype or "float16", args.batch or 1
    options = Options(dtype=args.dtype, batch=args.batch, input_shapes=dict(args.input_shape),
                      **calibration_options(args))
    return api.plan_model(args.model, args.target, options)


def _perf(args: argparse.Namespace) -> int:
    from rkcompile.plan.schema import write_atomically
    from rkcompile.views.perf import perf_csv, render_perf

    record = _plan_to_draw(args).record
    if args.csv is not None:
        write_atomically(args.csv, perf_csv(record))
    print(render_perf(record))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from rkcompile.commands.compare import compare, parse_targets, render_table, to_json
    from rkcompile.options import Options
    from rkcompile.plan.schema import STDOUT, write_atomically

    targets = parse_targets(args.target)
    options = Options(dtype=args.dtype, batch=args.batch, input_shapes=dict(args.input_shape),
                      **calibration_options(args))
    rows = compare(args.model, targets, options)
    to_stdout = args.json is not None and str(args.json) == STDOUT
    if args.json is not None:
        write_atomically(args.json, to_json(args.model, options, rows))
    print(render_table(args.model, options, rows), file=sys.stderr if to_stdout else sys.stdout)
    return 0 if any(row.error is None for row in rows) else 1


def _run(args: argparse.Namespace) -> int:
    import dataclasses
    import zipfile

    from rkcompile.options import Options
    from rkcompile.commands.run import run_command

    from rkcompile.quantization.params import IMAGE_SUFFIXES, ImagePreprocessing

    args.image_preprocessing = None
    if args.inputs is not None and args.inputs.suffix.lower() in IMAGE_SUFFIXES:
        # the image flags read the --inputs image; they plan the model only with a --calib to read too
        args.image_preprocessing = ImagePreprocessing(
            *(given if given is not None else default for given, default in zip(
                (args.mean_values, args.std_values, args.channel_order), dataclasses.astuple(ImagePreprocessing()))))
        if args.calib is None:
            args.mean_values = args.std_values = args.channel_order = None
    args.planning_flags = planning_flags(args)
    args.dtype, args.batch = args.dtype or "float16", args.batch or 1
    if args.plan is not None and zipfile.is_zipfile(args.plan):  # an artifact runs as planned
        return run_command(args, Options())
    options = Options(dtype=args.dtype, batch=args.batch, input_shapes=dict(args.input_shape),
                      **calibration_options(args))
    return run_command(args, options)


def planning_flags(args: argparse.Namespace) -> dict[str, object]:
    """The planning flags `run` was given, by flag: a saved artifact was planned with its own."""
    given = {"--dtype": args.dtype, "--batch": args.batch, "--calib": args.calib, "--val": args.val,
             "--calib-method": args.calib_method,
             "--float16": args.float16 or None, "--input-shape": args.input_shape or None,
             "--equalization": args.equalization, "--bias-correction": args.bias_correction,
             "--auto-float16": args.auto_float16,
             "--mean-values": args.mean_values, "--std-values": args.std_values, "--channel-order": args.channel_order}
    return {flag: value for flag, value in given.items() if value is not None}


def _export(args: argparse.Namespace) -> int:
    from rkcompile.options import Options
    from rkcompile.onnx_export import ExportOptions, export

    inputs = None
    if args.inputs is not None:
        from rkcompile.commands.run import load_npz

        inputs = load_npz(args.inputs)
    options = Options(dtype=args.dtype, batch=args.batch, input_shapes=dict(args.input_shape),
                      **calibration_options(args))
    tolerance = {} if args.tolerance is None else {"tolerance": args.tolerance}
    export_options = ExportOptions(freeze_inputs=dict(args.freeze_input), inputs=inputs, seed=args.seed,
                                   host_tail=args.host_tail, **tolerance)
    written = export(args.model, args.output, args.target, options, export_options)
    report = written.report
    print(f"wrote {written.path} (opset {report['opset']['export']}, {report['nodes']['export']} nodes from "
          f"{report['nodes']['model']}; {len(report['cpu_nodes'])} on the CPU in the plan) and {written.report_path}")
    if report["toolkit_input_reshapes"]:
        names = [entry["input"] for entry in report["toolkit_input_reshapes"]]
        print(f"  rknn-toolkit2 adds {len(names)} layer(s) on its CPU: the Reshape to 4-D of the int64 input(s) "
              f"{', '.join(names)}")
    if written.host_path is not None:
        tail = report["host_tail"]
        # a static graph's host part starts at the outputs' Reshapes it took from the NPU part
        starts = [*tail["selections_from"], *tail["data_dependent_from"]] or tail["static_nodes_moved_to_host"]
        print(f"  the host part starts at {', '.join(starts[:3])}{' ...' if len(starts) > 3 else ''}: "
              f"{written.path.name} ends in {len(tail['cut'])} tensor(s), {written.host_path} runs the other "
              f"{tail['nodes']['host']} nodes on onnxruntime ({len(tail['cpu_nodes_in_npu_part'])} plan CPU nodes "
              "left before the cut)")
    elif "data_dependent" in report:
        print(f"note: {report['data_dependent'][0]} has a shape the data decides, which rknn-toolkit2 cannot build: "
              "--host-tail writes the graph before it for the toolkit and the rest for onnxruntime", file=sys.stderr)
    emulated = {found.output: found.cosine for found in written.emulated}
    for found in written.agreements:
        prediction = f" (the emulator's for the int8 plan: {emulated[found.output]:.8f})" if emulated else ""
        print(f"  {found.output}: max abs {found.max_abs:.3g}, cosine {found.cosine:.8f} against {args.model} "
              f"on onnxruntime{prediction}")
    return 0


def _zoo(args: argparse.Namespace) -> int:
    from rkcompile.commands.zoo import zoo_command

    return zoo_command(args)


_COMMANDS = {"plan": _plan, "targets": _targets, "graph": _graph, "ops": _ops, "run": _run, "zoo": _zoo,
             "compare": _compare, "perf": _perf, "export": _export}


def console_main() -> NoReturn:
    """The `rkcompile` command as a process (the console script, `python -m rkcompile`): `main`,
    with what only a whole process may do.

    While the command's modules load (numpy, onnx, onnx-graphsurgeon, the pipeline), the cyclic
    garbage collector is paused, and the objects they made are then frozen out of its sight
    (gc.freeze): each collection the imports trigger walks what they have made so far, and
    pausing alone only moves that walk to the first collection after. A frozen object is never
    collected, so a long-lived caller of `main` (the tests) must not freeze what its earlier
    calls left. A float16 plan then keeps the collector off to the exit: what its passes drop is
    freed by reference counting, and a collection walks every object the plan made. Together
    they took 16-18% off a dev-zoo model's plan process CPU time (squeezenet1_1 0.28 -> 0.23 s,
    mobilenet_v2 0.35 -> 0.29 s, median of 7 processes). An int8 plan plans and drops candidate
    plans, each a graph of reference cycles holding its weights, so it collects.

    A plan process also loads numpy's OpenBLAS with one thread (OPENBLAS_NUM_THREADS=1, unless
    the caller set it): OpenBLAS starts a worker per core as it loads, each spinning while it
    waits for work. A float16 plan multiplies no large matrices, and those workers took a fifth
    of its process's CPU time (squeezenet1_1: 0.21 -> 0.27 s without the variable). An int8
    plan's matrix products (the emulator's int8 convolutions, judging candidate plans) are
    float32 sums of a few hundred taps, a small part of its time next to the elementwise work
    between them, during which the workers spin on the cores: on a shared 2-core machine,
    resnet18_halfwidth's int8 plan on 8 samples took 13.0 s CPU and 52.0 s wall with them,
    3.6 s and 13.7 s without (median of 2 processes each, in turn). It must be set before numpy
    loads, so the command is read from the arguments before the parser, which imports the
    command's modules, exists.

    Then the exit without the interpreter's teardown, which frees every object, module and
    extension table the command loaded, one by one, only to hand the memory back to the system:
    11-19% of the same processes' CPU time (yolov8n 0.44 -> 0.36 s). `_ExitWithoutTeardown`
    ends the process from the last exit handler, once the others have run."""
    argv = sys.argv[1:]
    exit_handler = _ExitWithoutTeardown()
    atexit.register(exit_handler)  # registered first, so it runs after every other exit handler
    with cyclic_collector_paused():
        if command_named(argv) == "plan":
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads it (the docstring says why)
        parser = build_parser(command_named(argv))  # what imports the command's modules
        gc.freeze()
    args = parser.parse_args(argv)
    if args.command == "plan" and args.dtype != "int8":
        gc.disable()  # to the exit (the docstring says why)
    exit_handler.code = _execute(args)
    sys.exit(exit_handler.code)


class _ExitWithoutTeardown:
    """An exit handler ending the process with `code` (os._exit) once the standard streams are
    flushed: by then the interpreter has waited for its threads and run the exit handlers
    registered after this one (logging's flush, temporary folders, process pools). Without a
    code (`main` raised: --help, a usage error), or under a profiler or tracer (cProfile,
    coverage, a debugger: they may write their results at the exit), the exit is the normal one."""

    def __init__(self):
        self.code: int | None = None

    def __call__(self) -> None:
        if self.code is None or sys.getprofile() is not None or sys.gettrace() is not None:
            return
        with contextlib.suppress(BrokenPipeError):  # the reader (`| head`) went away: quiet, as in main
            sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.code)

if __name__ == "__main__":
    console_main()
