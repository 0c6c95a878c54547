"""passes/ and targets/ install under the rkcompile namespace, never as top-level packages."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_namespace_mapping_in_the_editable_install(tmp_path):
    """Outside the checkout (so the current folder is not on sys.path) only rkcompile.* exists."""
    probe = ("import importlib.util, rkcompile.passes.legalize as l, rkcompile.targets.rk3588 as t;"
             "print(l.__file__); print(t.__file__);"
             "print(importlib.util.find_spec('passes'), importlib.util.find_spec('targets'))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    legalize_file, target_file, top_level = result.stdout.splitlines()
    assert Path(legalize_file).resolve().parent == REPO / "passes"
    assert Path(target_file).resolve().parent == REPO / "targets"
    assert top_level == "None None"


def test_wheel_maps_passes_and_targets_under_rkcompile(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("rkcompile-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "rkcompile/passes/legalize.py" in names
    assert "rkcompile/targets/rk3588.py" in names
    assert not any(n.startswith(("passes/", "targets/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rkcompile = rkcompile.cli:console_main" in zipfile.ZipFile(wheel).read(entry_points).decode()
