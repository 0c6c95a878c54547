"""The worker process an int8 choice's runs ahead go to (rkcompile/emulator/worker.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import rkcompile
from rkcompile import api
from rkcompile.emulator import worker as worker_module
from rkcompile.emulator.storage import EmulationError
from rkcompile.emulator.worker import RunWorker, WorkerGone

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"


@pytest.fixture(scope="module")
def plans() -> dict[str, rkcompile.Plan]:
    return {dtype: rkcompile.compile(EXAMPLE, "rk3588", dtype=dtype) for dtype in ("float16", "int8")}


@pytest.fixture
def worker():
    started = RunWorker()
    yield started
    started.close()


def _inputs(plan: rkcompile.Plan, seed: int) -> dict[str, np.ndarray]:
    random = np.random.default_rng(seed)
    return {spec.name: random.standard_normal(spec.shape).astype(spec.dtype) for spec in plan.record.model.inputs}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def test_the_worker_runs_a_plan_as_this_process_does(plans, worker):
    """Float16 and int8 plans, several inputs each, the plan sent once: bit for bit the outputs
    `rkcompile.run` gives here."""
    for token, plan in enumerate(plans.values()):
        for seed in range(3):
            inputs = _inputs(plan, seed)
            assert _same(worker.submit(token, plan.record, plan.weights, inputs).result(60), rkcompile.run(plan, inputs))
    assert list(worker.held) == [0, 1]


def test_the_worker_forgets_the_oldest_plan_past_its_budget(plans, worker, monkeypatch):
    """With room for one plan's weights, sending the other makes it forget the first; a run of the
    first sends it again, and every run still gives this process's outputs."""
    float16, int8 = plans["float16"], plans["int8"]
    monkeypatch.setattr(worker_module, "HELD_WEIGHT_BYTES", max(len(float16.weights), len(int8.weights)))
    for token, plan in ((0, float16), (1, int8), (0, float16)):
        inputs = _inputs(plan, token)
        assert _same(worker.submit(token, plan.record, plan.weights, inputs).result(60), rkcompile.run(plan, inputs))
        assert list(worker.held) == [token]


def test_a_failed_run_raises_where_it_is_awaited(plans, worker):
    """An emulation error in the worker is raised by the run's Future, with this process's text."""
    plan = plans["float16"]
    wrong = {spec.name: np.zeros((1, 1), np.float32) for spec in plan.record.model.inputs}
    with pytest.raises(EmulationError) as here:
        rkcompile.run(plan, wrong)
    with pytest.raises(EmulationError, match=str(here.value).replace("[", r"\[").replace("]", r"\]")):
        worker.submit(0, plan.record, plan.weights, wrong).result(60)


def test_a_worker_that_is_gone_hands_its_runs_back(plans, monkeypatch):
    """A worker that exited (here one that never started its loop): its runs fail with WorkerGone,
    and the runtime's run ahead is made on this process's thread instead, with the same outputs."""
    gone = RunWorker([sys.executable, "-c", "pass"])
    plan = plans["int8"]
    inputs = _inputs(plan, 0)
    with pytest.raises(WorkerGone):
        gone.submit(0, plan.record, plan.weights, inputs).result(60)
    with pytest.raises(WorkerGone):  # and every later run
        gone.submit(0, plan.record, plan.weights, inputs).result(60)
    monkeypatch.setattr(api, "_run_worker", lambda: gone)
    assert _same(api.EMULATOR_RUNTIME.run_ahead(plan, inputs).result(60), rkcompile.run(plan, inputs))
    gone.close()


def test_closing_ends_the_worker_and_cancels_its_pending_runs(plans):
    """`close` (registered with atexit) leaves no process behind; a run still pending is cancelled,
    not handed back to a process that is exiting."""
    started = RunWorker()
    plan = plans["int8"]
    pending = [started.submit(0, plan.record, plan.weights, _inputs(plan, seed)) for seed in range(20)]
    started.close()
    assert started.process.poll() is not None
    for future in pending:
        assert future.cancelled() or _same(future.result(60), rkcompile.run(plan, _inputs(plan, pending.index(future))))
    assert started.submit(0, plan.record, plan.weights, _inputs(plan, 0)).exception(60).__class__ is WorkerGone


def test_a_plan_keeps_its_token_and_is_forgotten_once_collected(plans, worker):
    """One token per plan object; once the caller's plan is collected, the worker drops it."""
    import gc

    plan = plans["int8"]
    copy = rkcompile.Plan(plan.record, plan.weights)
    token = worker.token(copy)
    assert worker.token(copy) == token and worker.token(plan) != token
    inputs = _inputs(copy, 0)
    assert _same(worker.submit(token, copy.record, copy.weights, inputs).result(60), rkcompile.run(plan, inputs))
    assert token in worker.held
    del copy
    gc.collect()
    worker.submit(worker.token(plan), plan.record, plan.weights, inputs).result(60)  # the drop is written first
    assert token not in worker.held


def test_each_process_starts_its_own_worker_unless_multiprocessing_started_it(monkeypatch):
    """A forked child (another process id) gets a worker of its own, never its parent's, whose
    pipes and threads are the parent's; a process multiprocessing started (a zoo pool's) gets
    none: it makes its runs ahead on a thread."""
    import multiprocessing

    monkeypatch.setattr(api, "_RUN_WORKERS", {})
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert api._run_worker() is None
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    monkeypatch.setattr(api.os, "getpid", lambda: -1)
    parent = api._run_worker()
    monkeypatch.setattr(api.os, "getpid", lambda: -2)
    child = api._run_worker()
    try:
        assert isinstance(parent, RunWorker) and isinstance(child, RunWorker) and child is not parent
        assert api._run_worker() is child
    finally:
        parent.close()
        child.close()


def test_two_at_a_time_keeps_blas_to_one_thread_and_restores_it():
    """Inside the emulator runtime's `two_at_a_time`, this process's BLAS runs one thread (the
    worker's does too); after it, as many as before."""
    import threadpoolctl

    def blas_threads() -> list[int]:
        return [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        if not before:
            pytest.skip("threadpoolctl finds no BLAS library in this numpy")
        with api.EMULATOR_RUNTIME.two_at_a_time():
            assert blas_threads() == [1] * len(before)
        assert blas_threads() == before


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no os.fork on this platform")
def test_a_forked_child_runs_ahead_on_a_thread_of_its_own(plans):
    """A child forked after this process ran ahead on its thread (a zoo pool worker) gets the
    run's outputs from a thread of its own, where its parent's executor would never run it."""
    import os

    plan = plans["int8"]
    inputs = _inputs(plan, 0)
    expected = api._run_here(plan, inputs).result(60)
    child = os.fork()
    if child == 0:  # the child reports by its exit code alone
        try:
            os._exit(0 if _same(api._run_here(plan, inputs).result(20), expected) else 1)
        except BaseException:  # noqa: BLE001  (a timeout among them)
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
