"""passes/ and targets/ install under the rkcompile namespace, never as top-level packages."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_namespace_mapping_in_the_running_install():
    import rkcompile.passes.legalize as legalize
    import rkcompile.targets.rk3588 as rk3588

    assert Path(legalize.__file__).resolve().parent == REPO / "passes"
    assert Path(rk3588.__file__).resolve().parent == REPO / "targets"
    assert importlib.util.find_spec("passes") is None
    assert importlib.util.find_spec("targets") is None


def test_wheel_maps_passes_and_targets_under_rkcompile(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("rkcompile-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "rkcompile/passes/legalize.py" in names
    assert "rkcompile/targets/rk3588.py" in names
    assert not any(n.startswith(("passes/", "targets/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rkcompile = rkcompile.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
