"""`rkcompile zoo DIR --scheduler ADDRESS` (issue 17): the zoo's jobs on a Dask distributed
cluster give the rows of the local process pool; without Dask, or without a scheduler that
answers, one error line."""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from rkcompile.commands import zoo
from rkcompile.cli import main

REPO = Path(__file__).resolve().parents[1]
SMALL_ZOO = REPO / "examples" / "zoo"


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def _rows(report: Path) -> list[dict]:
    """The rows of a --json report without what differs between any two runs (timings)."""
    rows = json.loads(report.read_text())["results"]
    return [{key: value for key, value in row.items() if key not in ("plan_seconds", "run_seconds")} for row in rows]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_scheduler_without_dask_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    err = _one_line_error(capsys, main(["zoo", str(SMALL_ZOO), "--scheduler", "tcp://127.0.0.1:8786"]))
    assert "pip install 'rkcompile[dask]'" in err


def test_scheduler_and_jobs_together_are_refused(capsys):
    err = _one_line_error(capsys, main(["zoo", str(SMALL_ZOO), "--scheduler", "tcp://127.0.0.1:8786",
                                        "--jobs", "2"]))
    assert "--jobs and --scheduler" in err


def test_a_scheduler_that_does_not_answer_is_one_line(monkeypatch, capsys):
    pytest.importorskip("distributed")
    monkeypatch.setattr(zoo, "SCHEDULER_TIMEOUT_SECONDS", 2)
    address = f"tcp://127.0.0.1:{_free_port()}"
    err = _one_line_error(capsys, main(["zoo", str(SMALL_ZOO), "--scheduler", address]))
    assert f"no Dask scheduler answers at {address}" in err


def test_a_two_worker_local_cluster_gives_the_rows_of_the_local_run(tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        assert main(["zoo", str(SMALL_ZOO), "--run", "--scheduler", cluster.scheduler_address,
                     "--json", str(tmp_path / "dask.json")]) == 0
        on_the_cluster = {name for name, prefix in cluster.scheduler.task_prefixes.items()
                          if sum(prefix.state_counts.values()) or prefix.all_durations}
        ran = {worker.address for worker in cluster.workers.values()}
    assert "evaluate" in on_the_cluster and len(ran) == 2
    assert main(["zoo", str(SMALL_ZOO), "--run", "--jobs", "2", "--json", str(tmp_path / "local.json")]) == 0
    local = _rows(tmp_path / "local.json")
    assert len(local) == len(list(SMALL_ZOO.glob("*.onnx"))) and all("worst_cosine" in row for row in local)
    assert _rows(tmp_path / "dask.json") == local
