"""What the user asks of a plan (`Options`, rkcompile.Options) and the int8 settings the
compiler may choose itself. Plain data, apart from the compiler: the Python API and the command
line take it without loading any of the compiler, so running a saved plan loads none.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


VERIFY_PASSES_VARIABLE = "RKCOMPILE_VERIFY_PASSES"


#: An int8 setting's value that leaves it to the compiler: chosen per model on the calibration data
CHOOSE = "auto"
#: The int8 settings CHOOSE searches, each with its candidates in order of preference: the first
#: of each is kept when no other candidate judges better (the defaults before they were chosen)
INT8_SETTINGS: dict[str, tuple] = {"calibration_method": ("minmax", "mmse"),
                                   "bias_correction": (True, False),
                                   "equalization": (False, True)}
#: Each int8 setting's first candidate: what a setting left to choose is planned with unsearched
PREFERRED_INT8 = {name: candidates[0] for name, candidates in INT8_SETTINGS.items()}


def settings_label(settings) -> str:
    """The int8 settings of `settings` (Options, or a mapping of its fields), as the plan names them."""
    value = settings.get if isinstance(settings, dict) else lambda name: getattr(settings, name)
    return ", ".join((value("calibration_method"),
                      "bias correction" if value("bias_correction") else "no bias correction",
                      "equalization" if value("equalization") else "no equalization"))


@dataclass(frozen=True)
class Options:
    """What the user asked of a plan: dtype, batch, core mask, input shapes, dumps, and the int8
    calibration settings."""

    dtype: str = "float16"
    batch: int = 1
    core_mask: str = "auto"  # NPU cores for one input: auto, 0, 1, 2, 0_1, 0_1_2
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dump_after: tuple[str, ...] = ()
    dump_dir: Path = Path(".")
    calibration: Path | None = None  # int8: .npy/.npz/image files, a folder of them, or a dataset.txt (rkcompile/quantization/params.py)
    # int8: inputs in calibration's formats that the plan is judged on, not calibrated on (--val;
    # rkcompile/compiler/validation.py); --auto-float16 then meets its target on them
    validation: Path | None = None
    # int8 calibration images (rknn-toolkit2's config): (x - mean) / std per channel, after the channels are
    # put in channel_order ("RGB" or "BGR"); one value serves every channel; quantize.ImagePreprocessing
    mean_values: tuple[float, ...] = (0.0,)
    std_values: tuple[float, ...] = (1.0,)
    channel_order: str = "RGB"
    # int8 settings: each a fixed value, or CHOOSE (the default): the candidates of INT8_SETTINGS
    # are judged on the calibration data and the best kept (rkcompile/compiler/int8_choice.py)
    calibration_method: str = CHOOSE  # int8 activation ranges: minmax, percentile, kl or mmse
    float16_tensors: tuple[str, ...] = ()  # int8: NPU steps writing these compute in float16 (hybrid)
    equalization: bool | str = CHOOSE  # cross-layer equalization of Conv -> Conv pairs
    bias_correction: bool | str = CHOOSE  # Conv biases absorb their rounded weights' mean shift
    auto_float16: float | None = None  # int8: the fewest float16 steps reaching this cosine (auto_float16.py)
    # `pipeline.verify` after every pass, for tests and debugging (--verify-passes, or
    # RKCOMPILE_VERIFY_PASSES=1 in the environment, which the test suite sets): a broken graph
    # invariant then fails at the pass that broke it instead of somewhere later
    verify_passes: bool = field(default_factory=lambda: os.environ.get(VERIFY_PASSES_VARIABLE, "0") not in ("", "0"))
