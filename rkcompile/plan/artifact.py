"""The plan artifact, `.rkplan`: one zip file holding everything execution needs.

- `plan.json`: the plan (`rkcompile.plan/2`), whose steps carry their operations;
- `weights.bin`: the weight region, the bytes the NPU reads, each weight at its planned offset
  in its planned layout and dtype (int8 plans: quantized, with the parameters in the plan);
- `cpu/partition_<id>.onnx`: each CPU partition as a standalone ONNX model for a CPU runtime
  (rkcompile/plan/cpu_partitions.py); the emulator runs the CPU steps from plan.json like the others;
- `reference_weights.npz` (optional): each weight's value in the model's own dtype, before the
  planned encoding (float16 rounding, int8 quantization), which accuracy analysis of a loaded plan
  runs its float reference with; written when the plan was compiled in the saving process. `load`
  checks its declared size but reads it only when asked (`DeferredMember`): running needs none of it.

- `digests.json`: the sha256 of every other member, which `load` checks (artifacts written
  before it existed load unchecked).

docs/plan-schema.md documents the format. This module reads and writes bytes only; a plain
plan JSON file (plan/1 or plan/2) loads too, with no weight region. The two weight members are
stored uncompressed: weights do not deflate (8% smaller at most, the zoo's), and inflating them
was most of the time a load took; `load` reads deflated members of older artifacts alike.

`load` trusts nothing in the file: before a member is decompressed its size, as the zip
declares it, is bounded by what the plan declares (the weight region's size, exactly; the
others by what the plan's sizes allow), so an artifact inflating to gigabytes is refused
without allocating them (zipfile never returns more than the declared size, and a member
longer than declared fails its CRC); members it does not know are refused, and so is a
plan.json nested too deep to parse.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from rkcompile.errors import CompileError
from rkcompile.plan.schema import PlanRecord, write_atomically

PLAN_MEMBER = "plan.json"
WEIGHTS_MEMBER = "weights.bin"
CPU_FOLDER = "cpu/"
REFERENCE_MEMBER = "reference_weights.npz"
DIGESTS_MEMBER = "digests.json"
CPU_MEMBER = re.compile(r"cpu/partition_(0|[1-9][0-9]{0,8})\.onnx")
#: plan.json's bound, which no plan declares: a hundred times the largest plan of the zoo
PLAN_JSON_LIMIT = 64 << 20
#: digests.json's bound: a few members' names and digests
DIGESTS_LIMIT = 1 << 20
#: what an ONNX model or an .npz adds to the tensors it holds (names, headers, graph), at most
CONTAINER_SLACK = 1 << 20
#: members written uncompressed (ZIP_STORED; the others are deflated): see the module's docstring
STORED_MEMBERS = frozenset({WEIGHTS_MEMBER, REFERENCE_MEMBER})
#: the largest element of a model weight's dtype (float64, int64) over the smallest a plan stores
#: (int8): how much larger the model's value of a weight may be than its planned bytes
WIDENING = 8


@dataclass(frozen=True)
class Artifact:
    plan: PlanRecord
    #: the weight region's bytes; None for a plan read from a plain JSON file
    weights: bytes | None
    #: partition id -> the serialized ONNX model of that CPU partition
    cpu_partitions: dict[int, bytes] = field(default_factory=dict)
    #: an .npz of each weight's model value (accuracy analysis's float reference), when saved;
    #: a loaded artifact's is read on demand
    reference_weights: bytes | DeferredMember | None = None


@dataclass(frozen=True)
class DeferredMember:
    """A loaded artifact's member read only when `read` is called, from the file again: it must
    still hold what it held at load time (the zip's CRC-32 of the member then, and its sha256 in
    digests.json when listed), within the size bound load checked."""
    path: Path
    name: str
    limit: int
    crc: int
    sha256: str | None

    def read(self) -> bytes:
        try:
            with zipfile.ZipFile(self.path) as archive:
                info = archive.getinfo(self.name)
                if info.CRC != self.crc or info.file_size > self.limit:
                    raise CompileError(f"{self.path}: member {self.name} changed since the plan was loaded")
                data = archive.read(info)
        except (OSError, KeyError, zipfile.BadZipFile) as exc:
            raise CompileError(f"{self.path}: member {self.name} can no longer be read "
                               f"({type(exc).__name__}: {exc})") from None
        return _checked(self.path, self.name, data, self.sha256)


def _checked(path: Path, name: str, data: bytes, sha256: str | None) -> bytes:
    """`data`, if it matches `sha256` (None: the artifact lists no digests)."""
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CompileError(f"{path}: member {name} does not match its sha256 in {DIGESTS_MEMBER} "
                           f"(the artifact was changed or damaged)")
    return data


def save(artifact: Artifact, path: str | Path) -> None:
    """Write the zip atomically: a failure leaves no file behind."""
    if artifact.weights is None:
        raise CompileError("the plan has no weight region to save (it was read from a JSON plan)")
    members = {PLAN_MEMBER: artifact.plan.to_json().encode("utf-8"), WEIGHTS_MEMBER: artifact.weights}
    members.update((f"{CPU_FOLDER}partition_{partition}.onnx", model)
                   for partition, model in sorted(artifact.cpu_partitions.items()))
    reference = artifact.reference_weights
    if reference is not None:
        members[REFERENCE_MEMBER] = reference.read() if isinstance(reference, DeferredMember) else reference
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    members[DIGESTS_MEMBER] = (json.dumps({"sha256": digests}, indent=1) + "\n").encode("utf-8")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data, zipfile.ZIP_STORED if name in STORED_MEMBERS else zipfile.ZIP_DEFLATED)
    write_atomically(path, buffer.getvalue())


def load(path: str | Path) -> Artifact:
    """An .rkplan zip, or a plan JSON file (weights None); a clear CompileError otherwise."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return _load_archive(path, archive)
        return Artifact(PlanRecord.from_dict(json.loads(path.read_text(encoding="utf-8"))), None)
    except FileNotFoundError:
        raise CompileError(f"{path} does not exist") from None
    except CompileError:
        raise
    except RecursionError:
        raise CompileError(f"{path} is not a readable plan (its JSON is nested too deep)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as exc:
        raise CompileError(f"{path} is not a readable plan ({type(exc).__name__}: {exc})") from None


def _load_archive(path: Path, archive: zipfile.ZipFile) -> Artifact:
    """The artifact in `archive`, each member read only once its declared size is within the
    bound the plan allows and checked against digests.json when there is one."""
    infos = {info.filename: info for info in archive.infolist()}
    missing = {PLAN_MEMBER, WEIGHTS_MEMBER} - set(infos)
    if missing:
        raise CompileError(f"{path} is not a plan artifact: no {', '.join(sorted(missing))}")
    unknown = sorted(name for name in infos if name not in (PLAN_MEMBER, WEIGHTS_MEMBER, REFERENCE_MEMBER,
                                                            DIGESTS_MEMBER) and not CPU_MEMBER.fullmatch(name))
    if unknown:
        raise CompileError(f"{path}: unknown member {unknown[0]!r} (an artifact holds {PLAN_MEMBER}, {WEIGHTS_MEMBER}, "
                           f"{CPU_FOLDER}partition_<id>.onnx, {REFERENCE_MEMBER} and {DIGESTS_MEMBER})")

    def bounded(name: str, limit: int, exact: bool = False) -> int:
        declared = infos[name].file_size
        if declared > limit or (exact and declared != limit):
            raise CompileError(f"{path}: member {name} is {declared} bytes, but its plan allows "
                               f"{'exactly ' if exact else 'at most '}{limit}")
        return limit

    def read(name: str, limit: int, exact: bool = False) -> bytes:
        bounded(name, limit, exact)
        return archive.read(name)

    digests = None
    if DIGESTS_MEMBER in infos:
        digests = json.loads(read(DIGESTS_MEMBER, DIGESTS_LIMIT).decode("utf-8"))["sha256"]
        unlisted = sorted(set(infos) - set(digests) - {DIGESTS_MEMBER})
        if unlisted or not set(digests) <= set(infos):
            name = (unlisted or sorted(set(digests) - set(infos)))[0]
            raise CompileError(f"{path}: member {name} is {'not in' if unlisted else 'missing, yet listed in'} "
                               f"{DIGESTS_MEMBER}")

    def checked(name: str, data: bytes) -> bytes:
        return _checked(path, name, data, None if digests is None else digests[name])

    text = checked(PLAN_MEMBER, read(PLAN_MEMBER, PLAN_JSON_LIMIT))
    plan = PlanRecord.from_dict(json.loads(text.decode("utf-8")))
    weight_bytes = plan.memory.weight_bytes
    weights = checked(WEIGHTS_MEMBER, read(WEIGHTS_MEMBER, weight_bytes, exact=True))
    # a member holding weights holds at most each in the model's own, widest dtype, and its container
    held = WIDENING * weight_bytes + len(text) + CONTAINER_SLACK
    cpu_ids = {partition.id for partition in plan.partitions if partition.device == "cpu"}
    cpu = {}
    for name in infos:
        match = CPU_MEMBER.fullmatch(name)
        if match:
            if int(match[1]) not in cpu_ids:
                raise CompileError(f"{path}: member {name} names no CPU partition of the plan")
            cpu[int(match[1])] = checked(name, read(name, held))
    reference = None
    if REFERENCE_MEMBER in infos:
        reference = DeferredMember(path.absolute(), REFERENCE_MEMBER, bounded(REFERENCE_MEMBER, held),
                                   infos[REFERENCE_MEMBER].CRC, None if digests is None else digests[REFERENCE_MEMBER])
    return Artifact(plan, weights, cpu, reference)
