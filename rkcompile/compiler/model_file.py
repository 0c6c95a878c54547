"""A model file's bytes and their sha256, read by a thread of their own.

Reading a model is a copy into fresh memory that the kernel faults in page by page, and hashing
it is a loop in hashlib's C code: both run without the interpreter lock, so a second core does
them while the interpreter works. The command line starts `read_ahead` on the model it names
before it imports numpy, onnx and the passes (about 0.15 s of interpreter work), and the import
pass's `read` then takes the bytes that thread left, if the file is still the one it read. A
model the command line did not name (the Python API) is read by `read` itself, its hash still
worked out beside the parse. Measured on tv_regnet_y_400mf (18 MB) and yolov10n (9 MB): the
read took 6-12 ms of the import pass; read ahead, the plan process took 8-14 ms less (median of
15 fresh processes each).
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

#: what a `.onnx` argument of the command line resolves to -> the thread reading it
_read_ahead: dict[Path, "ModelFile"] = {}


class ModelFile(threading.Thread):
    """One model file read (unless its bytes are given) and hashed by a daemon thread (a command
    that fails before it needs the file does not wait for it): `data` once the read is done,
    `hexdigest` once the hash is.
    The identity of the file read (device, inode, size, modification time) tells `read`
    whether the path still names it."""

    def __init__(self, path: Path, data: bytes | None = None):
        """`data`: the file's bytes, read already; the thread then only hashes them."""
        super().__init__(name="rkcompile-model-file", daemon=True)
        self.path = path
        self._read = threading.Event()
        self._data = data
        self._error: Exception | None = None
        self.identity: tuple | None = None
        self._hash = hashlib.sha256()
        if data is not None:
            self._read.set()
        self.start()

    def run(self) -> None:
        if not self._read.is_set():
            try:
                with open(self.path, "rb") as file:
                    self.identity = _identity(os.fstat(file.fileno()))
                    self._data = file.read()
            except Exception as exc:  # noqa: BLE001  (handed to the reader, as an inline read would raise it)
                self._error = exc
                return
            finally:
                self._read.set()
        self._hash.update(self._data)

    def data(self) -> bytes:
        """The file's bytes; raises what the read raised when it failed."""
        self._read.wait()
        if self._error is not None:
            raise self._error
        return self._data

    def hexdigest(self) -> str:
        self.join()
        return self._hash.hexdigest()


def read_ahead(path: str | os.PathLike) -> None:
    """Start reading `path` for a later `read`, when it names a regular file. Whatever keeps it
    from being looked at (a folder without search permission, a symlink loop) leaves it to the
    import pass, which says what is wrong."""
    try:
        resolved = Path(path).resolve()
        if not resolved.is_file() or resolved in _read_ahead:
            return
    except (OSError, RuntimeError):  # RuntimeError: Python 3.11's resolve() on a symlink loop
        return
    _read_ahead[resolved] = ModelFile(resolved)


def read(path: Path) -> ModelFile:
    """The file at `path`: the one `read_ahead` read, when the path names that file still (it
    is handed out once), else the file read here, its hash worked out on a thread. A file
    replaced or rewritten since its read ahead is read again. Read here, as before there was a
    read-ahead, rather than on a thread the caller would only wait for (its start and the lock's
    hand-offs: 0.7-4.9 ms for a 0.9 MB model on the test machine, whose read alone took 0.1-1.2
    ms). Raises what the read raises."""
    ahead = _read_ahead.pop(path.resolve(), None)
    if ahead is not None:
        try:
            ahead.data()
            current = _identity(os.stat(path))
        except OSError:
            current = None
        if current is not None and current == ahead.identity:
            return ahead
    return ModelFile(path, path.read_bytes())


def _identity(status: os.stat_result) -> tuple:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns
