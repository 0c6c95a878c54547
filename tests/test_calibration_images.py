"""int8 calibration from images (issue 17 item 5): rknn-toolkit2's mean_values, std_values and
channel order, images named by a dataset.txt or found in a folder, and one clear error line
for whatever cannot be read."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from rkcompile import api
from rkcompile.cli import main
from rkcompile.options import Options
from rkcompile.errors import CompileError
from rkcompile.api import EMULATOR_RUNTIME
from rkcompile.compiler.pipeline import compile_model
from rkcompile.plan.schema import TensorSpec
from rkcompile.quantization.params import ImagePreprocessing, load_calibration

Image = pytest.importorskip("PIL.Image")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny_cnn.onnx"  # input 'image' [1, 3, 64, 64]
#: A 4 wide, 5 high picture whose every pixel and channel differ.
PIXELS = np.arange(5 * 4 * 3, dtype=np.uint8).reshape(5, 4, 3) * 4
MEAN, STD = (10.0, 20.0, 30.0), (2.0, 4.0, 8.0)


def save_image(path: Path, pixels: np.ndarray = PIXELS) -> Path:
    Image.fromarray(pixels).save(path)
    return path


@pytest.mark.parametrize("shape, order, channels_last", [
    ((1, 3, 5, 4), "RGB", False), ((1, 3, 5, 4), "BGR", False), ((1, 5, 4, 3), "RGB", True),
    ((1, 5, 4, 3), "BGR", True)])
def test_an_image_becomes_the_input_as_rknn_toolkit2_reads_it(tmp_path, shape, order, channels_last):
    image = save_image(tmp_path / "a.png")
    (sample,) = load_calibration(image, [TensorSpec("x", shape, "float32")],
                                 ImagePreprocessing(MEAN, STD, order))
    rgb = PIXELS.astype(np.float64)
    ordered = rgb[..., ::-1] if order == "BGR" else rgb
    expected = (ordered - np.array(MEAN)) / np.array(STD)  # mean and std follow the model's channel order
    expected = expected if channels_last else expected.transpose(2, 0, 1)
    assert sample["x"].dtype == np.float32
    np.testing.assert_array_equal(sample["x"], expected[None].astype(np.float32))


def test_a_one_channel_input_reads_the_image_in_grey(tmp_path):
    image = save_image(tmp_path / "a.png")
    (sample,) = load_calibration(image, [TensorSpec("x", (1, 1, 5, 4), "float32")], ImagePreprocessing((0,), (255,)))
    grey = np.asarray(Image.open(image).convert("L"), np.float64) / 255
    np.testing.assert_array_equal(sample["x"][0, 0], grey.astype(np.float32))


def test_the_layout_is_the_one_whose_height_and_width_are_the_images(tmp_path):
    """[1, 3, 5, 3] could be NCHW (5x3 images) or NHWC (3 high, 5 wide): the image's size decides."""
    wide = save_image(tmp_path / "wide.png", PIXELS[:3, :, :].repeat(2, axis=1)[:, :5])  # 3 high, 5 wide
    (sample,) = load_calibration(wide, [TensorSpec("x", (1, 3, 5, 3), "float32")])
    np.testing.assert_array_equal(sample["x"][0], np.asarray(Image.open(wide), np.float32))


def test_a_folder_of_images_and_a_dataset_txt_naming_images(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        save_image(folder / f"{i}.png", PIXELS + i)
    (folder / "notes.md").write_text("not calibration data")
    spec = TensorSpec("x", (1, 3, 5, 4), "float32")
    samples = load_calibration(folder, [spec], ImagePreprocessing(std_values=(255.0,)))
    assert [float(s["x"][0, 0, 0, 0]) for s in samples] == [np.float32(i / 255) for i in range(3)]
    # two inputs: an image for the first, a .npy for the second, in input order
    np.save(tmp_path / "b0.npy", np.full((1, 2), 7, np.float32))
    listing = tmp_path / "dataset.txt"
    listing.write_text("images/2.png b0.npy\n")
    (sample,) = load_calibration(listing, [spec, TensorSpec("b", (1, 2), "float32")],
                                 ImagePreprocessing(std_values=(255.0,)))
    np.testing.assert_array_equal(sample["x"], samples[2]["x"])
    assert sample["b"].tolist() == [[7, 7]]


def test_a_jpeg_is_read(tmp_path):
    image = tmp_path / "a.jpg"
    Image.fromarray(np.full((5, 4, 3), 128, np.uint8)).save(image, quality=95)
    (sample,) = load_calibration(image, [TensorSpec("x", (1, 3, 5, 4), "float32")])
    assert np.abs(sample["x"] - 128).max() <= 2


def test_images_read_unnormalized_are_warned_about(tmp_path, caplog):
    load_calibration(save_image(tmp_path / "a.png"), [TensorSpec("x", (1, 3, 5, 4), "float32")])
    assert "1 images read as RGB values 0-255" in caplog.text and "--mean-values" in caplog.text


@pytest.mark.parametrize("spec, preprocessing, message", [
    (TensorSpec("x", (1, 3, 8, 8), "float32"), ImagePreprocessing(), "the image is 4x5, input x [1, 3, 8, 8] takes 8x8"),
    (TensorSpec("x", (1, 8, 5, 4), "float32"), ImagePreprocessing(), "an image fills an input of shape [1, C, H, W]"),
    (TensorSpec("x", (1, 3, 5, 4), "float32"), ImagePreprocessing(mean_values=(1.0, 2.0)),
     "--mean-values 1.0,2.0: give one value or one per channel (3)"),
])
def test_an_image_that_does_not_fit_is_one_clear_error(tmp_path, spec, preprocessing, message):
    with pytest.raises(CompileError, match=re.escape(message)):
        load_calibration(save_image(tmp_path / "a.png"), [spec], preprocessing)


@pytest.mark.parametrize("preprocessing, message", [
    (dict(std_values=(1.0, 0.0, 1.0)), "a standard deviation of 0"),
    (dict(channel_order="GRB"), "--channel-order GRB: choose from RGB, BGR"),
    (dict(mean_values=(float("nan"),)), "give finite numbers"),
])
def test_bad_preprocessing_is_refused(preprocessing, message):
    with pytest.raises(CompileError, match=re.escape(message)):
        ImagePreprocessing(**preprocessing)


def test_an_unreadable_image_names_the_dataset_line(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    listing = tmp_path / "dataset.txt"
    listing.write_text("broken.png\n")
    with pytest.raises(CompileError, match=re.escape(f"{listing} line 1: {tmp_path / 'broken.png'} is not a readable image")):
        load_calibration(listing, [TensorSpec("x", (1, 3, 5, 4), "float32")])


def test_without_pillow_an_image_is_one_error_naming_the_extra(tmp_path, monkeypatch):
    image = save_image(tmp_path / "a.png")
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL raises ImportError
    with pytest.raises(CompileError, match=re.escape("needs Pillow (pip install 'rkcompile[images]')")):
        load_calibration(image, [TensorSpec("x", (1, 3, 5, 4), "float32")])


def test_preprocessing_with_no_image_to_apply_it_to_is_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1, 3, 5, 4), np.float32))
    with pytest.raises(CompileError, match="holds no image, and --mean-values"):
        load_calibration(tmp_path / "a.npy", [TensorSpec("x", (1, 3, 5, 4), "float32")], ImagePreprocessing((1.0,)))
    with pytest.raises(CompileError, match="apply to calibration images; add --calib"):
        compile_model(EXAMPLE, "rk3588", Options(dtype="int8", mean_values=(1.0,)), runtime=EMULATOR_RUNTIME)


def _imagenet_pictures(folder: Path, count: int = 3) -> list[np.ndarray]:
    folder.mkdir()
    pictures = [np.random.default_rng(i).integers(0, 256, (64, 64, 3), dtype=np.uint8) for i in range(count)]
    for i, pixels in enumerate(pictures):
        save_image(folder / f"{i}.png", pixels)
    return pictures


def test_plan_from_images_equals_plan_from_the_same_inputs_preprocessed(tmp_path, capsys):
    """The CLI flags reach the images: the plan calibrated on PNGs with mean, std and BGR is the
    plan calibrated on the .npy inputs a user would have computed from them."""
    pictures = _imagenet_pictures(tmp_path / "png")
    mean, std = np.array([103.53, 116.28, 123.675]), np.array([57.375, 57.12, 58.395])
    (tmp_path / "npy").mkdir()
    for i, pixels in enumerate(pictures):
        value = ((pixels[..., ::-1] - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)
        np.save(tmp_path / "npy" / f"{i}.npy", value)
    plans = {}
    for source, extra in (("png", ["--mean-values", "103.53,116.28,123.675", "--std-values", "57.375,57.12,58.395",
                                   "--channel-order", "BGR"]), ("npy", [])):
        assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--dtype", "int8", "--quiet", "--calib",
                     str(tmp_path / source), "--json", str(tmp_path / f"{source}.json"), *extra]) == 0
        plans[source] = api.load(tmp_path / f"{source}.json").record.quantization
    assert plans["png"] == plans["npy"]
    # without the flags the same images calibrate other ranges: the flags are not ignored
    unnormalized = compile_model(EXAMPLE, "rk3588", Options(dtype="int8", calibration=tmp_path / "png"),
                                 runtime=EMULATOR_RUNTIME)[0]
    assert unnormalized.quantization != plans["png"]


def test_the_api_takes_one_number_for_every_channel(tmp_path):
    _imagenet_pictures(tmp_path / "png")
    by_number = api.compile(EXAMPLE, "rk3588", dtype="int8", calibration=tmp_path / "png", std_values=255,
                            channel_order="BGR")
    by_tuple = api.compile(EXAMPLE, "rk3588", dtype="int8", calibration=tmp_path / "png", std_values=[255, 255, 255],
                           channel_order="BGR")
    assert by_number.record.quantization == by_tuple.record.quantization


@pytest.mark.parametrize("argv, message", [
    (["--mean-values", "1,2,3"], "apply to int8 plans; add --dtype int8"),
    (["--dtype", "int8", "--std-values", "1,x"], "expected numbers separated by commas"),
])
def test_image_flags_errors_are_one_line(capsys, argv, message):
    try:
        code = main(["plan", str(EXAMPLE), "--target", "rk3588", *argv])
    except SystemExit as usage_error:  # argparse's, one line too
        code = usage_error.code
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and err.startswith("error: ") and message in err
