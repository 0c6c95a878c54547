"""int8 quantization: calibration data, range observers, and the parameters of each tensor.

The arithmetic every int8 tensor follows is real = (q - zero_point) * scale:

- **activations**: asymmetric, one scale and zero point per tensor (per-layer), q in [-128, 127].
  Every NPU operator in seeds 000/001 and the oplist V2.3.2 lists "Quantization support:
  per-layer" for its data inputs and outputs; none lists per-channel for an activation.
- **weights**: per-channel (one scale and zero point per output channel, axis 0) where the
  operator lists per-channel for its weight: Convolution and Depthwise Convolution on every
  platform (oplist V2.3.2, weight: "量化支持 per-layer, per-channel"), asymmetric as
  rknn-toolkit2 quantizes them (`weight_params`). Every other constant is per-layer and
  symmetric (zero point 0), q in [-127, 127] so that -q is always representable, unless it
  has few distinct values that an asymmetric grid holds better (`constant_params`).
- **convolution biases**: int32, scale = input scale x weight scale of the channel, zero point 0,
  so the bias adds to the int32 accumulator as it is.

Activation ranges come from running the planned graph in float32 on calibration inputs
(`rkcompile.emulator.float_reference`) and observing each tensor: its min and max
("minmax"), the 0.01 and 99.99 percentiles ("percentile"), or the clipping threshold that
minimises the KL divergence of the clipped 8-bit histogram from the float one ("kl", the
TensorRT entropy calibration, applied to |x| and then intersected with [min, max]).
Every range is widened to include 0 so that real zero (padding, ReLU) is exactly a q value.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from rkcompile.errors import CompileError
from rkcompile.plan.schema import CHANNEL_ORDERS, Quantization, TensorSpec

log = logging.getLogger("rkcompile")

METHODS = ("minmax", "percentile", "kl", "mmse")
PERCENTILE = 99.99
INT8 = (-128, 127)
WEIGHT_INT8 = (-127, 127)
INT32 = (-(2 ** 31), 2 ** 31 - 1)

#: Ops that only move, select or take the max of values: an affine map commutes with them, so
#: their int8 output is their int8 input's values under the same parameters.
MOVEMENT_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Split",
                          "MaxPool", "GlobalMaxPool", "Gather", "Expand", "Tile", "DepthToSpace",
                          "SpaceToDepth"})


def is_movement(node) -> bool:
    """Whether an int8 `node` (a compiler node or a plan's plain node) keeps its input's
    parameters (MOVEMENT_OPS)."""
    if "body" in node.attrs:
        return False
    if node.op == "Resize":
        mode = node.attrs.get("mode", "nearest")
        return (mode.decode() if isinstance(mode, bytes) else mode) == "nearest"
    return node.op in MOVEMENT_OPS


#: Random calibration inputs used when no --calib is given (a warning says so).
RANDOM_SAMPLES = 4
#: Fewer --calib samples than this, with no --val to judge the plan on, get a warning
FEW_CALIBRATION_SAMPLES = 32
#: Values kept per tensor and sample for the percentile and KL observers.
KEPT_VALUES = 1 << 14
KL_BINS = 2048
KL_LEVELS = 128
KL_STRIDE = 8
#: Clipping thresholds the mmse observer tries: max|x| times 1/MMSE_STEPS, 2/MMSE_STEPS, ..., 1
MMSE_STEPS = 100
#: Values at each end of a tensor's kept values whose error alone can dismiss an mmse threshold
MMSE_EXTREMES = 2048
#: Values of the evenly strided sample whose partition finds the cuts of the mmse extremes
MMSE_SAMPLE = 1 << 13
#: Relative margin over the float64 summations' rounding (below 1e-13 for 2^20 values) before a
#: part of a threshold's error dismisses it
MMSE_SAFETY = 1e-9
#: How far a threshold's mean error computed in float32 (`_float32_mean_error`) may be from the
#: float64 one, as a fraction of (that error + its grid's scale squared): three times the bound
#: of its roundings (`mmse_range`)
MMSE_FLOAT32_MARGIN = 3e-4
#: A per-layer constant with at most this many distinct values gets the grid that holds them
#: best (`constant_params`), not only the symmetric one.
FEW_VALUES = 256
#: Ops whose weight input (index 1) may be quantized per output channel (axis 0):
#: oplist V2.3.2, Convolution and Depthwise Convolution, weight "per-layer, per-channel".
PER_CHANNEL_WEIGHTS = frozenset({"Conv"})


# ---- calibration data ----------------------------------------------------------------------

#: Image files calibration reads (with Pillow), as rknn-toolkit2's dataset.txt names them.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@dataclass(frozen=True)
class ImagePreprocessing:
    """How a calibration image becomes a model input, as rknn-toolkit2's config does it: the
    image decodes to RGB values 0-255 (grey for a one-channel input), its channels are put in
    `channel_order` (quant_img_RGB2BGR), then each channel c of that order becomes
    (x - mean[c]) / std[c] (mean_values, std_values; one value serves every channel), and the
    [H, W, C] pixels are laid out as the input's [1, C, H, W] or [1, H, W, C]. rknn-toolkit2 folds
    mean and std into the model; here the model takes its input already normalized, so they
    apply to the calibration images only."""

    mean_values: tuple[float, ...] = (0.0,)
    std_values: tuple[float, ...] = (1.0,)
    channel_order: str = "RGB"

    def __post_init__(self):
        if self.channel_order not in CHANNEL_ORDERS:
            raise CompileError(f"--channel-order {self.channel_order}: choose from {', '.join(CHANNEL_ORDERS)}")
        for flag, values in (("--mean-values", self.mean_values), ("--std-values", self.std_values)):
            if not values or not all(np.isfinite(values)):
                raise CompileError(f"{flag} {','.join(map(str, values))}: give finite numbers")
        if not all(np.asarray(self.std_values) != 0):
            raise CompileError(f"--std-values {','.join(map(str, self.std_values))}: a standard deviation of 0")

    @property
    def is_default(self) -> bool:
        return self == ImagePreprocessing()


def calibration_samples(path: Path | None, specs: Sequence[TensorSpec],
                        images: ImagePreprocessing) -> list[dict[str, np.ndarray]]:
    """--calib's samples (`load_calibration`), or seeded random ones with a warning when there is
    no --calib (`random_calibration`); image preprocessing without --calib is refused."""
    if path is not None:
        return load_calibration(path, specs, images)
    if not images.is_default:
        raise CompileError("--mean-values, --std-values and --channel-order apply to calibration images; add --calib")
    return random_calibration(specs)


def samples_for(options, specs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
    """`calibration_samples` as the plan's options ask for them (`Options.calibration` and its
    image preprocessing): the one reading the quantize pass and an int8 Planner share. Fewer
    than FEW_CALIBRATION_SAMPLES given with no --val to judge the plan on are warned about."""
    samples = calibration_samples(options.calibration, specs, ImagePreprocessing(
        options.mean_values, options.std_values, options.channel_order))
    if options.calibration is not None and options.validation is None and len(samples) < FEW_CALIBRATION_SAMPLES:
        log.warning("int8 calibration: %d samples; ranges fitted on fewer than %d may not hold for other inputs, "
                    "and nothing shows whether they do: pass --val PATH (inputs kept out of --calib) to judge the "
                    "plan on", len(samples), FEW_CALIBRATION_SAMPLES)
    return samples


def load_calibration(path: Path, specs: Sequence[TensorSpec],
                     images: ImagePreprocessing | None = None) -> list[dict[str, np.ndarray]]:
    """Calibration samples from a folder of .npy/.npz/image files, from one such file, or from
    a list file (.txt, rknn-toolkit2's dataset.txt): one sample a line, its .npy or image paths
    separated by spaces in the order of the model's inputs, relative to the list's folder.

    An .npz gives arrays keyed by input name (other keys, such as reference outputs, are
    ignored); a .npy or an image is the model's only input (or, in a dataset.txt line, the input
    at its position). An array of the input's shape is one sample, one with an extra leading
    axis is a stack of samples. Images follow `images` (ImagePreprocessing); preprocessing other
    than the default with no image to apply it to is refused rather than ignored.
    """
    images = images or ImagePreprocessing()
    reader = _Reader(images)
    samples = _read_samples(Path(path), specs, reader)
    if not reader.images_read and not images.is_default:
        raise CompileError(f"--calib: {path} holds no image, and --mean-values, --std-values and --channel-order "
                           f"apply to images only (.npy/.npz inputs are taken as the model reads them)")
    if reader.images_read and images.is_default:
        log.warning("int8 calibration: %d images read as RGB values 0-255, unnormalized; if the model takes "
                    "normalized input, pass --mean-values and --std-values", reader.images_read)
    return samples


def validation_samples(options, specs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
    """--val's samples (`Options.validation`, read as --calib is, images preprocessed alike):
    inputs an int8 plan is judged on but not calibrated on."""
    images = ImagePreprocessing(options.mean_values, options.std_values, options.channel_order)
    return _read_samples(Path(options.validation), specs, _Reader(images, "--val"))


def _read_samples(path: Path, specs: Sequence[TensorSpec], reader: "_Reader") -> list[dict[str, np.ndarray]]:
    """The samples at `path` in `load_calibration`'s formats, read by `reader`."""
    if path.is_file() and path.suffix.lower() == ".txt":
        return _samples_listed(path, specs, reader)
    return [sample for file in _calibration_files(path, reader.flag)
            for sample in _samples_of(file, reader.arrays(file, specs, str(file)), specs, reader.flag)]


def _calibration_files(path: Path, flag: str) -> list[Path]:
    """The files of a --calib folder (.npy, .npz and images, in name order), or the one file."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CompileError(f"{flag}: {path} does not exist")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".npy", ".npz") + IMAGE_SUFFIXES)
    if not files:
        raise CompileError(f"{flag}: folder {path} holds no .npy, .npz or image ({', '.join(IMAGE_SUFFIXES)}) file")
    return files


def _samples_listed(listing: Path, specs: Sequence[TensorSpec], reader: "_Reader") -> list[dict[str, np.ndarray]]:
    """The samples of a dataset.txt: each line's paths, one .npy or image per model input, in
    input order."""
    try:
        lines = listing.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CompileError(f"{reader.flag}: cannot read {listing} ({exc})") from None
    samples: list[dict[str, np.ndarray]] = []
    for number, line in enumerate(lines, 1):
        paths = line.split()
        if not paths or paths[0].startswith("#"):
            continue
        where = f"{listing} line {number}"
        if len(paths) != len(specs):
            raise CompileError(f"{reader.flag}: {where} names {len(paths)} files, the model has {len(specs)} inputs "
                               f"({', '.join(spec.name for spec in specs)})")
        arrays = {}
        for spec, text in zip(specs, paths):
            file = listing.parent / text
            if file.suffix.lower() not in (".npy",) + IMAGE_SUFFIXES:
                raise CompileError(f"{reader.flag}: {where}: {text} is neither a .npy array nor an image "
                                   f"({', '.join(IMAGE_SUFFIXES)})")
            if not file.is_file():
                raise CompileError(f"{reader.flag}: {where}: {file} does not exist")
            arrays[spec.name] = reader.arrays(file, [spec], where)[spec.name]
        samples += _samples_of(Path(where), arrays, specs, reader.flag)
    if not samples:
        raise CompileError(f"{reader.flag}: {listing} lists no sample")
    return samples


class _Reader:
    """Reads calibration (or --val) files, counting the images it decoded; a failure names
    `flag`, the option that named them."""

    def __init__(self, images: ImagePreprocessing, flag: str = "--calib"):
        self.images, self.flag, self.images_read = images, flag, 0

    def arrays(self, file: Path, specs: Sequence[TensorSpec], where: str) -> dict[str, np.ndarray]:
        if file.suffix.lower() not in IMAGE_SUFFIXES:
            return _read_arrays(file, specs, self.flag)
        if len(specs) != 1:
            raise CompileError(f"{self.flag}: {file} is an image but the model has {len(specs)} inputs; list each "
                               f"sample's files, one per input, in a dataset.txt")
        self.images_read += 1
        return {specs[0].name: read_image(file, specs[0], self.images, where, self.flag)}


def read_image(file: Path, spec: TensorSpec, how: ImagePreprocessing, where: str, flag: str = "--calib") -> np.ndarray:
    """The image at `file` as a value of the model input `spec` (ImagePreprocessing says how);
    a failure names `flag`, the option that named the file."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise CompileError(f"{flag}: {where}: reading the image {file.name} needs Pillow (pip install "
                           f"'rkcompile[images]'), or save each preprocessed input with numpy.save") from None
    try:
        with Image.open(file) as image:
            size = image.size
            channels, height, width, channels_last = _image_layout(spec, size, where, flag)
            pixels = np.asarray(image.convert("L" if channels == 1 else "RGB"), np.float64)
    except (OSError, UnidentifiedImageError) as exc:
        raise CompileError(f"{flag}: {where}: {file} is not a readable image ({exc})") from None
    pixels = pixels.reshape(height, width, channels)
    if how.channel_order == "BGR":
        pixels = pixels[..., ::-1]
    mean, std = (_per_channel(values, channels, flag) for values, flag in
                 ((how.mean_values, "--mean-values"), (how.std_values, "--std-values")))
    pixels = (pixels - mean) / std
    laid_out = pixels if channels_last else pixels.transpose(2, 0, 1)
    return laid_out.reshape(spec.shape).astype(spec.dtype)


def _image_layout(spec: TensorSpec, size: tuple[int, int], where: str, flag: str) -> tuple[int, int, int, bool]:
    """(channels, height, width, channels last) of the input an image of `size` (width, height)
    fills: [1, C, H, W] or [1, H, W, C] with C 1 or 3, the one whose H and W are the image's."""
    shape = tuple(spec.shape)
    layouts = []
    if len(shape) == 4 and shape[0] == 1:
        if shape[1] in (1, 3):
            layouts.append((shape[1], shape[2], shape[3], False))
        if shape[3] in (1, 3):
            layouts.append((shape[3], shape[1], shape[2], True))
    if not layouts:
        raise CompileError(f"{flag}: {where}: an image fills an input of shape [1, C, H, W] or [1, H, W, C] with "
                           f"C 1 or 3; {spec.name} has shape {list(shape)}")
    width, height = size
    for layout in layouts:
        if (layout[1], layout[2]) == (height, width):
            return layout
    _, want_height, want_width, _ = layouts[0]
    raise CompileError(f"{flag}: {where}: the image is {width}x{height}, input {spec.name} {list(shape)} takes "
                       f"{want_width}x{want_height} images; resize them as the model expects")


def _per_channel(values: tuple[float, ...], channels: int, flag: str) -> np.ndarray:
    if len(values) not in (1, channels):
        raise CompileError(f"{flag} {','.join(map(str, values))}: give one value or one per channel ({channels})")
    return np.asarray(values, np.float64)


def _read_arrays(file: Path, specs: Sequence[TensorSpec], flag: str) -> dict[str, np.ndarray]:
    try:
        if file.suffix.lower() == ".npy":
            if len(specs) != 1:
                raise CompileError(f"{flag}: {file} is a .npy but the model has {len(specs)} inputs; "
                                   f"use .npz files keyed by input name")
            return {specs[0].name: np.load(file, allow_pickle=False)}
        with np.load(file, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
        raise CompileError(f"{flag}: {file} is not a readable .npy/.npz ({exc})") from None


def _samples_of(file: Path, arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec], flag: str) -> list[dict]:
    missing = [spec.name for spec in specs if spec.name not in arrays]
    if missing:
        raise CompileError(f"{flag}: {file} has no array for input {', '.join(missing)}")
    counts = set()
    stacks = {}
    for spec in specs:
        array = np.asarray(arrays[spec.name])
        shape = tuple(spec.shape)
        if array.shape == shape:
            array = array[None]
        elif array.shape[1:] != shape:
            raise CompileError(f"{flag}: {file} input {spec.name} has shape {list(array.shape)}, "
                               f"the model takes {list(shape)}")
        stacks[spec.name] = array.astype(spec.dtype, copy=False)
        counts.add(len(array))
    if len(counts) != 1:
        raise CompileError(f"{flag}: {file} holds different numbers of samples per input")
    return [{name: stack[i] for name, stack in stacks.items()} for i in range(counts.pop())]


def random_calibration(specs: Sequence[TensorSpec], count: int = RANDOM_SAMPLES, seed: int = 0) -> list[dict]:
    """Seeded standard-normal samples for float inputs, with a warning: ranges from noise fit no
    real input. Integer and bool inputs (token ids, masks) are 1: a valid id of any vocabulary
    and an open mask, where random values could index past a small embedding."""
    log.warning("int8 without --calib: calibrating on %d seeded random inputs; the ranges will not fit "
                "real data, so pass --calib PATH (a folder of .npy/.npz inputs or images, one .npz, or a "
                "dataset.txt)", count)
    rng = np.random.default_rng(seed)

    def sample(spec: TensorSpec) -> np.ndarray:
        if np.dtype(spec.dtype).kind in "fc":
            return rng.standard_normal(spec.shape).astype(spec.dtype)
        return np.ones(spec.shape, spec.dtype)

    return [{spec.name: sample(spec) for spec in specs} for _ in range(count)]


def seeded_variations(x: np.ndarray, count: int = 3, seed: int = 0) -> list[np.ndarray]:
    """Variations of one input, for a calibration set when only one real input is at hand (the
    zoo's tests and tools/int8_table.py): flipped along the last axis (every other one),
    rescaled by U(0.8, 1.2), plus Gaussian noise of a tenth of its standard deviation. Noise of
    a fixed size would drown an image in [0, 1] and be no input the model is made for (the zoo's
    yolov8n then reaches 30x its deep activations' range on the real input)."""
    random = np.random.default_rng(seed)
    variations = []
    for i in range(1, count + 1):
        flipped = x[..., ::-1] if i % 2 else x
        noise = random.normal(0, 0.1 * float(x.std()), x.shape)
        variations.append((flipped * random.uniform(0.8, 1.2) + noise).astype(x.dtype))
    return variations


# ---- observing ranges ----------------------------------------------------------------------

class KeptDraws:
    """The positions a RangeObserver keeps at each update, by the sizes of its updates so far
    that drew: each observer draws from its own generator seeded alike, so observers of tensors
    of one size keep the same positions at the same update, and these draw them once (one
    KeptDraws serves a calibration's observers, or every calibration of a Planner's)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.found: dict[tuple[int, ...], tuple[np.ndarray, dict]] = {}  # sizes -> positions, generator state after

    def positions(self, sizes: tuple[int, ...]) -> np.ndarray:
        """KEPT_VALUES positions of sizes[-1] values, drawn after draws from sizes[:-1]."""
        if sizes in self.found:  # drawn already (every update but a calibration's first of each size)
            return self.found[sizes][0]
        known = len(sizes)
        while known and sizes[:known] not in self.found:
            known -= 1
        rng = np.random.default_rng(self.seed)
        if known:
            rng.bit_generator.state = self.found[sizes[:known]][1]
        for drawn in range(known + 1, len(sizes) + 1):
            self.found[sizes[:drawn]] = (rng.choice(sizes[drawn - 1], KEPT_VALUES, replace=False),
                                         rng.bit_generator.state)
        return self.found[sizes][0]


class RangeObserver:
    """The running min/max of one tensor over the calibration samples, plus a uniform sample
    of its values when the method needs the distribution (the positions `draws` keeps, which
    are those a generator of `seed` would draw: `KeptDraws`)."""

    def __init__(self, method: str, seed: int = 0, draws: KeptDraws | None = None):
        if method not in METHODS:
            raise CompileError(f"unknown calibration method {method!r} (choose from {', '.join(METHODS)})")
        self.method = method
        self.low, self.high = np.inf, -np.inf
        self.kept: list[np.ndarray] = []
        self.draws = draws if draws is not None and draws.seed == seed else KeptDraws(seed)
        self.drawn: tuple[int, ...] = ()  # the sizes of the updates that drew
        self.found: tuple[float, float] | None = None  # range()'s answer until the next update
        self.nonfinite = 0  # the infinities and NaNs seen, which no range holds


    def update(self, value: np.ndarray) -> None:
        flat = np.asarray(value, np.float32).reshape(-1)
        if not flat.size:
            return
        low, high = flat.min(), flat.max()
        if not (np.isfinite(low) and np.isfinite(high)):  # a NaN or an infinity is among them (min and max show it)
            finite = flat[np.isfinite(flat)]
            self.nonfinite += flat.size - finite.size
            flat = finite
            if not flat.size:
                return
            low, high = flat.min(), flat.max()
        self.found = None
        self.low, self.high = min(self.low, float(low)), max(self.high, float(high))
        if self.method != "minmax":
            if flat.size > KEPT_VALUES:
                self.drawn += (flat.size,)
                flat = flat[self.draws.positions(self.drawn)]
            self.kept.append(flat)

    def answers(self, method: str) -> bool:
        """Whether `range(method)` can be found from what was observed: its own method, or minmax
        (every observer keeps the min and max)."""
        return method in (self.method, "minmax")

    def range(self, method: str | None = None) -> tuple[float, float]:
        """The calibrated [low, high] by `method` (default: the observer's own; another must be
        minmax, `answers`). KL and mmse search for it, so it is kept until the next update."""
        if method is not None and method != self.method:
            if not self.answers(method):
                raise ValueError(f"a {self.method} observer keeps no values for {method}")
            return (0.0, 0.0) if self.low > self.high else (self.low, self.high)
        if self.found is None:
            self.found = self._search()
        return self.found

    def _search(self) -> tuple[float, float]:
        if self.low > self.high:  # never saw a finite value
            return 0.0, 0.0
        if self.method == "minmax":
            return self.low, self.high
        values = np.concatenate(self.kept)
        if self.method == "percentile":
            low, high = np.percentile(values, [100 - PERCENTILE, PERCENTILE])
            return float(low), float(high)
        if self.method == "mmse":
            return mmse_range(values, self.low, self.high)
        # a one-signed tensor spends all 255 steps on one side, a two-signed one half each
        levels = 2 * KL_LEVELS - 1 if self.low >= 0 or self.high <= 0 else KL_LEVELS
        # zeros left out, as ncnn's calibration leaves them: every grid holds 0 exactly, and
        # half a ReLU's output in the first bin made the merged bins near 0 decide the cut
        # (a ReLU of N(0, 1) clipped at 1.75 against 4.4 without them)
        threshold = kl_threshold(np.abs(values[values != 0]), levels=levels)
        return max(self.low, -threshold), min(self.high, threshold)


def kl_threshold(magnitudes: np.ndarray, bins: int = KL_BINS, levels: int = KL_LEVELS) -> float:
    """The |x| clipping threshold whose `levels`-level quantization of the histogram is closest
    (in KL divergence) to the full histogram, the clipped tail counted in the last kept bin:
    TensorRT's entropy calibration, trying every KL_STRIDE-th cut and the whole histogram (a
    one-signed tensor's 255-level cuts otherwise stop a bin short of it: a constant tensor's
    values, all in the last bin, were then clipped to an eighth of themselves, and its range
    came out inverted, [value, value / 8])."""
    top = float(magnitudes.max(initial=0))
    if top == 0:
        return 0.0
    histogram, edges = np.histogram(magnitudes, bins=bins, range=(0, top))
    histogram = histogram.astype(np.float64)
    best, best_divergence = bins, np.inf
    for cut in sorted({*range(levels, bins + 1, KL_STRIDE), bins}):
        kept = histogram[:cut]
        reference = kept.copy()
        reference[-1] += histogram[cut:].sum()
        starts = np.linspace(0, cut, levels + 1).astype(int)
        occupied = (kept > 0).astype(np.float64)
        # each of the `levels` groups of bins spreads its count evenly over its non-empty bins
        counts = np.add.reduceat(kept, starts[:-1])
        filled = np.add.reduceat(occupied, starts[:-1])
        per_bin = np.divide(counts, filled, out=np.zeros_like(counts), where=filled > 0)
        candidate = np.repeat(per_bin, np.diff(starts)) * occupied
        p, q = reference / reference.sum(), candidate / max(candidate.sum(), 1e-12)
        mask = p > 0
        divergence = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if divergence < best_divergence:
            best, best_divergence = cut, divergence
    return float(edges[best])


def mmse_range(values: np.ndarray, low: float, high: float, steps: int = MMSE_STEPS) -> tuple[float, float]:
    """The clip [max(low, -t), min(high, t)], t a multiple of max(|low|, high) / steps, whose int8
    quantize-dequantize of `values` (float32, as observers keep them; others are rounded to
    float32 first) has the least mean squared error against them: rknn-toolkit2's
    quantized_algorithm 'mmse', a 1-D search per tensor. Clipping a rare tail buys finer steps
    for the bulk of the values; one threshold on |x| clips only the side that has the tail.

    The answer is the full search's, computed in float64 over every value (`_squared_errors`),
    for less. Each threshold's error is first computed in float32 (`_float32_mean_error`, a
    third of the memory traffic), which is within MMSE_FLOAT32_MARGIN of the float64 one; only
    thresholds whose float32 error is within the margins of the least one can be the answer, and
    when there is more than one, their float64 errors decide. A threshold whose float64 error
    on about MMSE_EXTREMES values at each end alone (a part of its sum of squares: every term is
    >= 0) is already above an error some threshold is known to stay under cannot be chosen and
    is not computed at all: the clips that cut deep into a tail are dismissed on a few thousand
    values, every threshold's part at once.

    A value of 0 has error 0 at every grid (each holds 0 exactly), so with zeros among the
    values (half of a ReLU's output) the float32 errors are summed over the others only."""
    single = np.asarray(values, np.float32).reshape(-1)
    values = single.astype(np.float64)
    low, high = min(low, 0.0), max(high, 0.0)
    peak = max(-low, high)
    clips = [(max(low, -threshold), min(high, threshold)) for threshold in peak * np.arange(steps, 0, -1) / steps]
    # activation_params' grids, every threshold's at once
    scales, zeros = asymmetric_grids(np.array([c[0] for c in clips]), np.array([c[1] for c in clips]))
    parts = np.zeros(steps)
    if values.size > 4 * MMSE_EXTREMES:
        parts = _squared_errors_at_each(_extremes(values), scales, zeros).sum(axis=1) / values.size
    on_every_grid = bool(np.all((INT8[0] - zeros <= 0) & (INT8[1] - zeros >= 0)))  # 0's integer is never clipped
    summed = single[single != 0] if on_every_grid else single
    scratch = np.empty_like(summed)
    screened: dict[int, float] = {}  # threshold index -> its float32 mean error
    below = np.inf  # an error some threshold's float64 error is known to stay under
    for index, (scale, zero, part) in enumerate(zip(scales, zeros, parts)):
        if part > below * (1 + MMSE_SAFETY):
            continue
        screened[index] = _float32_mean_error(summed, scale, zero, scratch) * summed.size / values.size
        below = min(below, screened[index] + _float32_margin(screened[index], scale))
    near = [index for index, error in screened.items() if error - _float32_margin(error, scales[index]) <= below]
    if len(near) == 1:
        return clips[near[0]]
    rounded, single = np.empty_like(values), np.empty(values.shape, np.float32)
    errors = {index: float(np.mean(_squared_errors(values, scales[index], zeros[index], rounded, single)))
              for index in near}
    return clips[min(errors, key=errors.get)]  # the first of equals, as thresholds go from the widest


def _float32_margin(error: float, scale: float) -> float:
    """How far a float32 mean error may be from the float64 one (`mmse_range`): the roundings
    move a value's error by at most about 1e-4 of (its error + scale^2): a value within 5e-5 of
    a step from a rounding tie may round to the other neighbour (its error then moves by at most
    1e-4 scale^2), the dequantized float32 value moves by at most 2^-15 scale, and float32's
    summation of at most 2^24 terms by 3e-6 of the sum."""
    return MMSE_FLOAT32_MARGIN * (error + float(scale) ** 2)


def _float32_mean_error(values: np.ndarray, scale: float, zero: float, scratch: np.ndarray) -> float:
    """The mean of (dequantize(quantize(values)) - values)^2 at the grid of `scale` and `zero`,
    computed in float32 in `scratch` (of `values`' shape): within `_float32_margin` of
    `_squared_errors`' float64 mean."""
    step = np.float32(scale)
    np.divide(values, step, out=scratch)
    np.rint(scratch, out=scratch)
    np.clip(scratch, np.float32(INT8[0] - zero), np.float32(INT8[1] - zero), out=scratch)
    scratch *= step
    scratch -= values
    np.square(scratch, out=scratch)
    return float(scratch.mean()) if scratch.size else 0.0


def _extremes(values: np.ndarray) -> np.ndarray:
    """About MMSE_EXTREMES of `values` at each end (of more than 4 * MMSE_EXTREMES): those
    beyond the cuts an evenly strided sample puts that far in (a partition of the sample, not of
    every value), or strictly beyond a cut that too many equal (the zeros of a ReLU's output)."""
    sample = values[::max(1, values.size // MMSE_SAMPLE)]
    at = max(1, round(sample.size * MMSE_EXTREMES / values.size))
    ends = np.partition(sample, (at, sample.size - at - 1))
    found = []
    for beyond, strictly in ((values <= ends[at], values < ends[at]),
                             (values >= ends[sample.size - at - 1], values > ends[sample.size - at - 1])):
        found.append(values[beyond if np.count_nonzero(beyond) <= 2 * MMSE_EXTREMES else strictly])
    return np.concatenate(found)


def _squared_errors_at_each(values: np.ndarray, scales: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """(threshold, value): `_squared_errors` of `values` at each threshold's grid."""
    shape = (scales.size, values.size)
    return _squared_errors(values[None, :], scales[:, None], zeros[:, None], np.empty(shape), np.empty(shape, np.float32))


def _squared_errors(values: np.ndarray, scale, zero, rounded: np.ndarray, single: np.ndarray) -> np.ndarray:
    """(dequantize(quantize(values)) - values)^2 element by element at the grid of float64 `scale`
    and `zero` (point), in `rounded` (scratch of the result's shape, as `single` in float32);
    `values` and the grid broadcast (a grid per row).

    The same float64 operations as dequantize(quantize(...)) (the int8 round trip of quantize's
    integers in [-128, 127] is exact, so it is left out; adding the zero point, clipping to
    [-128, 127] and taking it off again is clipping the rounded integers to [-128 - zero,
    127 - zero], exactly, in one pass instead of three)."""
    np.divide(values, scale, out=rounded)
    np.rint(rounded, out=rounded)
    np.clip(rounded, INT8[0] - zero, INT8[1] - zero, out=rounded)
    rounded *= scale
    np.copyto(single, rounded, casting="same_kind")  # the float32 the plan computes in
    np.copyto(rounded, single)  # back, exactly: a float64 subtraction is twice as fast as a mixed one
    error = np.subtract(rounded, values, out=rounded)
    return np.square(error, out=error)


# ---- parameters ----------------------------------------------------------------------------

def activation_params(low: float, high: float, source: str, zero_point_0: bool = True) -> Quantization:
    """Asymmetric int8 for [low, high], widened to include 0 so real zero is exact. With
    `zero_point_0` False (a target whose toolkit misreads it: `Target.allows_activation_zero_point_0`)
    a range whose zero point comes out 0 gets the narrower of the two grids with zero point -1
    and 1 that hold it: q -128 ... 127 is real -127 ... 128 steps or -129 ... 126, a step at most
    1.2% coarser (a zero point of 0 means -low / scale is within half a step of 128)."""
    low, high = np.float64(low), np.float64(high)
    scale, zero_point = asymmetric_grids(low, high)
    if zero_point == 0 and not zero_point_0:
        scale, zero_point = min((max(-low / (zero - INT8[0]), high / (INT8[1] - zero)), zero) for zero in (-1, 1))
    return Quantization("int8", (float(scale),), (int(zero_point),), None, source)


def asymmetric_grids(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Element by element, the scale and zero point of asymmetric int8 on [low, high] widened to
    include 0 (all 256 steps; scale 1 for an empty span): one formula for an activation's range
    and for every output channel of a weight at once."""
    low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
    span = high - low
    scales = np.where(span > 0, span / (INT8[1] - INT8[0]), 1.0)
    return scales, np.clip(np.rint(INT8[0] - low / scales), *INT8)


def weight_params(values: np.ndarray, per_channel: bool, name: str = "a constant") -> Quantization:
    """Per output channel (axis 0): asymmetric, each channel's [min, max] (widened to include 0)
    on all 256 int8 steps with its own zero point, as rknn-toolkit2 2.5.0 quantizes convolution
    weights (docs/quantization.md: its simulator's per-layer cosines match this to 5 digits on
    every Conv step of tv_mnasnet0_5 and tv_mobilenet_v3_small, and not the symmetric form).
    One scale for the tensor otherwise (`constant_params`).

    An infinite value (an attention mask's fill, -inf) has no int8 grid of its own: the grid
    spans the finite values and 0, which every grid here holds exactly, and the infinite ones
    saturate to its ends, as `quantize` clips (the plan's `warning` says so). A NaN has no int8
    value at all: a CompileError naming the constant (`name`)."""
    values = np.asarray(values, np.float64)
    infinite = np.isinf(values)
    if np.isnan(values).any():
        raise CompileError(f"int8: {name} holds {int(np.isnan(values).sum())} NaN value(s), which int8 cannot store; "
                           f"keep the step reading it in float16 (--float16)")
    if infinite.any():
        values = np.where(infinite, 0.0, values)
    if per_channel and values.ndim >= 2:
        # every channel at once, not a call per channel (35,000 of them for mobilenet_v2,
        # whose int8 plan computed them twice)
        rows = values.reshape(values.shape[0], -1)
        scales, zero_points = asymmetric_grids(rows.min(axis=1), rows.max(axis=1))
        params = Quantization("int8", tuple(scales.tolist()), tuple(int(z) for z in zero_points), 0, "weights")
    else:
        params = constant_params(values)
    if infinite.any():
        params = replace(params, warning=f"{name} holds {int(infinite.sum())} infinite value(s): stored as int8 they "
                                         f"saturate to the ends of its grid")
    return params


def constant_params(values: np.ndarray) -> Quantization:
    """One scale for a constant that is not a Conv weight: symmetric, zero point 0, q in
    [-127, 127], unless the constant has at most FEW_VALUES distinct values that another grid
    of the same 256 levels holds with less squared error (its zero point then fitting the
    range, as an activation's does: every NPU operand is per-layer asymmetric int8, seeds
    000/001). A detector head's constants are the case: strides 8, 16, 32 are 31, 62 and 124
    steps of 8/31 exactly, where the symmetric step 32/127 makes 8 into 8.06 (0.8% on every box
    of that stride); anchor points 0.5, 1.5, ..., 79.5 are steps of 0.5 from zero point -128,
    where the symmetric step 0.63 puts an anchor up to 0.31 off. The grids tried have step
    span / n for n = 255 ... 1 over the range widened to include 0; the symmetric grid stays
    when it already holds the values to 1e-6 of their peak (a scalar, a 0.5)."""
    values = np.asarray(values, np.float64).reshape(-1)
    peak = float(np.abs(values).max(initial=0))
    symmetric = Quantization("int8", (peak / WEIGHT_INT8[1] if peak > 0 else 1.0,), (0,), None, "weights")
    if peak == 0:
        return symmetric
    # a prefix with more distinct values than FEW_VALUES settles it without sorting the whole
    # constant (a transformer's MatMul weight: ~16 ms per quarter million values)
    if len(values) > 4 * FEW_VALUES and len(np.unique(values[:4 * FEW_VALUES])) > FEW_VALUES:
        return symmetric
    distinct, counts = np.unique(values, return_counts=True)
    if len(distinct) > FEW_VALUES:
        return symmetric

    def squared_error(scale: float, zero_point: int, levels: tuple[int, int]) -> float:
        q = np.clip(np.rint(distinct / scale) + zero_point, *levels)
        return float(np.sum(counts * ((q - zero_point) * scale - distinct) ** 2))

    best, least = symmetric, squared_error(symmetric.scales[0], 0, WEIGHT_INT8)
    if least <= counts.sum() * (1e-6 * peak) ** 2:
        return symmetric
    low, high = min(float(distinct[0]), 0.0), max(float(distinct[-1]), 0.0)
    for steps in range(INT8[1] - INT8[0], 0, -1):
        scale = (high - low) / steps
        zero_point = int(np.clip(np.rint(INT8[0] - low / scale), *INT8))
        error = squared_error(scale, zero_point, INT8)
        if error < least:
            best, least = Quantization("int8", (scale,), (zero_point,), None, "weights"), error
    return best


def bias_params(input_quant: Quantization, weight_quant: Quantization) -> Quantization:
    """int32, scale = input scale x weight scale per channel, so it adds to the accumulator."""
    scales = tuple(input_quant.scales[0] * s for s in weight_quant.scales)
    axis = 0 if len(scales) > 1 else None
    return Quantization("int32", scales, (0,) * len(scales), axis, "bias")


def fit_bias(weight_quant: Quantization, input_quant: Quantization, bias: np.ndarray) -> Quantization:
    """The weight's parameters with each channel's scale raised, where needed, so that its bias
    fits int32 at scale input scale x weight scale: a tiny input range (a random-weight
    network's near-zero features before a classifier whose output is mostly its bias, e.g. the
    wide zoo's tv_googlenet) would otherwise saturate the bias, a silent wrong answer (0.87
    output cosine there). Coarser weights on such a channel cost less than a clipped bias; the
    parameters say so in `warning`."""
    bias = np.abs(np.asarray(bias, np.float64)).reshape(-1)
    scales = np.broadcast_to(np.asarray(weight_quant.scales, np.float64), bias.shape)
    needed = bias / (input_quant.scales[0] * INT32[1])
    if not (needed > scales).any():
        return weight_quant
    raised = np.maximum(scales, needed)
    if len(weight_quant.scales) == 1:
        raised = np.array([raised.max()])
    count = int((needed > scales).sum())
    warning = (f"{count} channel(s) of this weight have a bias that int32 cannot hold at input scale "
               f"{input_quant.scales[0]:.3g} x weight scale; their weight scale is raised (up to "
               f"{float((raised / np.resize(np.asarray(weight_quant.scales), raised.shape)).max()):.3g}x) so the bias fits")
    return replace(weight_quant, scales=tuple(float(v) for v in raised), warning=warning)


def _broadcast(values: Iterable[float], quant: Quantization, ndim: int) -> np.ndarray:
    array = np.asarray(tuple(values), np.float64)
    if quant.axis is None or ndim == 0:
        return array.reshape(())
    shape = [1] * ndim
    shape[quant.axis] = -1
    return array.reshape(shape)


def quantize(real: np.ndarray, quant: Quantization) -> np.ndarray:
    """round-half-to-even(real / scale) + zero point, saturated to the stored type: in float64,
    on one new array (the quotient) that each later operation works in place. A fresh float64
    array per operation cost its fresh pages on a large map: 4.6 against 2.7 ms on a
    96x112x112 one."""
    ndim = np.ndim(real)
    scale = _broadcast(quant.scales, quant, ndim)
    zero = _broadcast(quant.zero_points, quant, ndim)
    low, high = INT32 if quant.dtype == "int32" else INT8
    scaled = np.asarray(np.divide(real, scale, dtype=np.float64))  # the values convert exactly inside the division
    np.rint(scaled, out=scaled)
    scaled += zero
    np.clip(scaled, low, high, out=scaled)
    return scaled.astype(quant.dtype)


def dequantize(values: np.ndarray, quant: Quantization) -> np.ndarray:
    """(q - zero point) * scale, in float32 (exact for int8 with a float32 scale)."""
    values = np.asarray(values)
    scale = _broadcast(quant.scales, quant, values.ndim)
    zero = _broadcast(quant.zero_points, quant, values.ndim)
    return scaled_float32(np.subtract(values, zero, dtype=np.float64), scale)


def scaled_float32(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """values * scale computed in float64 and rounded to float32, written straight into the
    float32 result: the float64 product of a map's size is never made (3.9 against 2.5 ms
    dequantizing a 96x112x112 map; an int8 step's accumulator made real, 8.3 against 1.9)."""
    values = np.asarray(values)
    shape = np.broadcast_shapes(values.shape, np.shape(scale))
    # in the values' memory order (a channels-last accumulator's), as their product's would be:
    # a result in another order made the multiplication slower than the two passes it replaces
    out = np.empty_like(values, np.float32) if shape == values.shape else np.empty(shape, np.float32)
    return np.multiply(values, scale, out=out, dtype=np.float64, casting="same_kind")
