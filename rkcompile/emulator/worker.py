"""A second process that executes plans for this one (`RunWorker`), and its main loop (`main`).

Two emulator runs on two threads of one process give about 1.3x the throughput of one: much of
a run is numpy calls short enough that the threads queue for the interpreter lock between them
(mobilenet_v2 int8: 48.5 ms a run alone, 38.5 ms a run with two threads running; in two
processes 50 ms each, 2.0x). An int8 choice judges its candidates two runs at a time
(rkcompile/compiler/int8_choice.py), so the run it makes ahead goes to a worker process.

The worker is `python -m rkcompile.emulator.worker`, spoken to in pickled messages over its
standard input and output, not a multiprocessing child: those import the parent's main script,
and a user's script without an `if __name__ == "__main__":` guard would plan again in each. It
holds the plans it is sent (record and weight region, by token) until told to forget one, runs
them as `emulate` does here (the same code on the same values: the same outputs, bit for bit),
ignores Ctrl-C (the terminal sends it to the parent's whole process group; the parent decides)
and exits when its input closes, which the parent's exit does.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Mapping

import numpy as np

from rkcompile.plan.schema import PlanRecord

#: weight bytes of the plans a worker holds at most: the oldest it was sent is forgotten first
HELD_WEIGHT_BYTES = 512 << 20
#: the folder holding the rkcompile package this module belongs to
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


class WorkerGone(RuntimeError):
    """The worker process exited, or never started: its runs are to be made here."""


class RunWorker:
    """The parent's side: `submit` sends a plan (once per token) and a run, and returns the run's
    outputs' Future, which a thread of this object completes as the worker replies. A worker
    that dies fails every pending run with WorkerGone, and so does every later `submit`."""

    def __init__(self, command: list[str] | None = None):
        # its standard error is dropped: a worker that cannot start or dies only sends its runs
        # back here (WorkerGone), where they give the same outputs. It starts in the folder that
        # holds this rkcompile package, which `-m` looks in first: the worker runs this code,
        # whatever other rkcompile the caller's folder or path might hold
        self.process = subprocess.Popen(command or [sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=PACKAGE_PARENT)
        self.lock = threading.Lock()
        self.pending: dict[int, Future] = {}
        self.jobs = itertools.count()
        self.held: collections.OrderedDict[int, int] = collections.OrderedDict()  # token -> weight bytes
        self.tokens: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()  # `token`'s
        self.next_token = itertools.count()
        self.gone = self.closed = False
        # messages are written by a thread of their own: a pipe takes 64 KiB, and a plan's
        # weights written while the worker runs would hold the caller until the run ended
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._write, name="rkcompile-worker-write", daemon=True).start()
        threading.Thread(target=self._read, name="rkcompile-worker-read", daemon=True).start()
        atexit.register(self.close)

    def token(self, owner: object) -> int:
        """The token of the plan `owner` (a weak-referenceable object, the caller's plan) stands
        for, made on first use; the worker forgets the plan once `owner` is collected."""
        with self.lock:
            token = self.tokens.get(owner)
            if token is None:
                token = self.tokens[owner] = next(self.next_token)
                weakref.finalize(owner, self.forget, token)
        return token

    def submit(self, token: int, record: PlanRecord, weights: bytes, inputs: Mapping[str, np.ndarray]) -> Future:
        """The outputs of the plan (`record`, `weights`; `token` names it to the worker) on `inputs`."""
        future: Future = Future()
        with self.lock:
            if self.gone:
                future.set_exception(WorkerGone("the worker process has exited"))
                return future
            if token not in self.held:
                while self.held and sum(self.held.values()) + len(weights) > HELD_WEIGHT_BYTES:
                    self.outbox.put(("forget", self.held.popitem(last=False)[0]))
                self.held[token] = len(weights)
                self.outbox.put(("plan", token, record, weights))
            job = next(self.jobs)
            self.pending[job] = future
            self.outbox.put(("run", job, token, dict(inputs)))
        return future

    def close(self, timeout: float = 5.0) -> None:
        """Close the worker's input, which ends it, and wait for it to exit (killed after `timeout`
        seconds): no process outlives its parent's exit (`RunWorker` registers this with atexit)."""
        with self.lock:
            self.gone = self.closed = True
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def forget(self, token: int) -> None:
        """Let the worker drop the plan `token` (its plan here is gone). A plan's weakref.finalize
        calls this at a garbage collection, on whatever thread it happens, maybe one holding
        `lock`: so it only queues the request (SimpleQueue.put may be called so), and the writer
        thread looks at `held` under the lock."""
        self.outbox.put(("drop", token))

    def _write(self) -> None:
        try:
            while True:
                message = self.outbox.get()
                if message[0] == "drop":
                    with self.lock:
                        if self.held.pop(message[1], None) is None:
                            continue
                    message = ("forget", message[1])
                pickle.dump(message, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                self.process.stdin.flush()
        except (OSError, ValueError):  # the worker's input is closed: it exited
            self._fail()

    def _read(self) -> None:
        try:
            while True:
                job, outputs, error = pickle.load(self.process.stdout)
                with self.lock:
                    future = self.pending.pop(job, None)
                if future is None:  # cancelled by `close` meanwhile
                    continue
                if error is None:
                    future.set_result(outputs)
                else:
                    future.set_exception(error)
        except (EOFError, OSError, pickle.UnpicklingError):
            self._fail()

    def _fail(self) -> None:
        """The worker is gone: its pending runs fail with WorkerGone, or are cancelled when this
        side closed it (the process is exiting: nothing is to run them here)."""
        with self.lock:
            self.gone = True
            failed, self.pending = list(self.pending.values()), {}
        for future in failed:
            if self.closed:
                future.cancel()
            elif not future.done():
                future.set_exception(WorkerGone("the worker process exited during a run"))


def main() -> None:
    """The worker: read messages until the input closes (see the module's docstring)."""
    import threadpoolctl

    from rkcompile.emulator.session import Prepared, emulate

    # it runs beside the parent's own runs: one BLAS thread each (api.EmulatorRuntime.two_at_a_time)
    threadpoolctl.threadpool_limits(limits=1, user_api="blas")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the replies get standard output's pipe to themselves: whatever else writes there, a print
    # or a library's C code, goes to standard error instead and cannot fall between them
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    plans: dict[int, Prepared] = {}
    while True:
        try:
            message = pickle.load(requests)
        except EOFError:
            return
        if message[0] == "plan":
            _, token, record, weights = message
            plans[token] = Prepared(record, weights)
        elif message[0] == "forget":
            plans.pop(message[1], None)
        else:
            _, job, token, inputs = message
            try:
                reply = (job, emulate(plans[token], inputs).outputs, None)
            except Exception as exc:  # noqa: BLE001  (the parent raises it where it waits, as a thread's run would)
                reply = (job, None, _sendable(exc))
            pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
            replies.flush()


def _sendable(error: Exception) -> Exception:
    """`error`, or a RuntimeError with its text when it does not pickle."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001  (any failure to pickle)
        return RuntimeError(f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
