"""The plan artifact, `.rkplan`: one zip file holding everything execution needs.

- `plan.json`: the plan (`rkcompile.plan/2`), whose steps carry their operations;
- `weights.bin`: the weight region, the bytes the NPU reads, each weight at its planned offset
  in its planned layout and dtype (int8 plans: quantized, with the parameters in the plan);
- `cpu/partition_<id>.onnx`: each CPU partition as a standalone ONNX model for a CPU runtime
  (rkcompile/plan/cpu_partitions.py); the emulator runs the CPU steps from plan.json like the others;
- `reference_weights.npz` (optional): each weight's value in the model's own dtype, before the
  planned encoding (float16 rounding, int8 quantization), which accuracy analysis of a loaded plan
  runs its float reference with; written when the plan was compiled in the saving process.

docs/plan-schema.md documents the format. This module reads and writes bytes only; a plain
plan JSON file (plan/1 or plan/2) loads too, with no weight region.
"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import field
from pathlib import Path

from rkcompile.errors import CompileError
from rkcompile.plan.schema import Plan, write_atomically
from rkcompile.plan.records import frozen_dataclass

PLAN_MEMBER = "plan.json"
WEIGHTS_MEMBER = "weights.bin"
CPU_FOLDER = "cpu/"
REFERENCE_MEMBER = "reference_weights.npz"


@frozen_dataclass
class Artifact:
    plan: Plan
    #: the weight region's bytes; None for a plan read from a plain JSON file
    weights: bytes | None
    #: partition id -> the serialized ONNX model of that CPU partition
    cpu_partitions: dict[int, bytes] = field(default_factory=dict)
    #: an .npz of each weight's model value (accuracy analysis's float reference), when saved
    reference_weights: bytes | None = None


def save(artifact: Artifact, path: str | Path) -> None:
    """Write the zip atomically: a failure leaves no file behind."""
    if artifact.weights is None:
        raise CompileError("the plan has no weight region to save (it was read from a JSON plan)")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(PLAN_MEMBER, artifact.plan.to_json())
        archive.writestr(WEIGHTS_MEMBER, artifact.weights)
        for partition, model in sorted(artifact.cpu_partitions.items()):
            archive.writestr(f"{CPU_FOLDER}partition_{partition}.onnx", model)
        if artifact.reference_weights is not None:
            archive.writestr(REFERENCE_MEMBER, artifact.reference_weights)
    write_atomically(path, buffer.getvalue())


def load(path: str | Path) -> Artifact:
    """An .rkplan zip, or a plan JSON file (weights None); a clear CompileError otherwise."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
                missing = {PLAN_MEMBER, WEIGHTS_MEMBER} - names
                if missing:
                    raise CompileError(f"{path} is not a plan artifact: no {', '.join(sorted(missing))}")
                plan = Plan.from_dict(json.loads(archive.read(PLAN_MEMBER).decode("utf-8")))
                cpu = {int(name[len(CPU_FOLDER + "partition_"):-len(".onnx")]): archive.read(name)
                       for name in names if name.startswith(CPU_FOLDER + "partition_") and name.endswith(".onnx")}
                reference = archive.read(REFERENCE_MEMBER) if REFERENCE_MEMBER in names else None
                return Artifact(plan, archive.read(WEIGHTS_MEMBER), cpu, reference)
        return Artifact(Plan.from_dict(json.loads(path.read_text(encoding="utf-8"))), None)
    except FileNotFoundError:
        raise CompileError(f"{path} does not exist") from None
    except CompileError:
        raise
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise CompileError(f"{path} is not a readable plan ({type(exc).__name__}: {exc})") from None
