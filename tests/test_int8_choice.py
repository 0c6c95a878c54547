"""The int8 settings chosen per model on the calibration data (rkcompile/compiler/int8_choice.py)."""
from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import helper
from test_int8_accuracy import _calibration, _save, _technique, chain, observed_runs, uneven  # noqa: F401 (fixtures)

import rkcompile
from rkcompile.cli import main
from rkcompile.options import CHOOSE, INT8_SETTINGS, PREFERRED_INT8, Options, settings_label
from rkcompile.emulator import agreement
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.compiler.auto_float16 import Judge
from rkcompile.compiler.int8_choice import candidates, choose_settings, next_sample
from rkcompile.api import EMULATOR_RUNTIME
from rkcompile.compiler.pipeline import compile_model


def _samples(calibration) -> list[dict[str, np.ndarray]]:
    return [{"x": np.load(path)} for path in sorted(calibration.glob("*.npy"))]


def _worst_cosine(plan, reference: FloatReference, samples) -> float:
    return min(agreement("y", rkcompile.run(plan, sample)["y"], reference.run(sample)["y"]).cosine
               for sample in samples)


def test_the_choice_keeps_the_candidate_whose_worst_calibration_cosine_is_best(chain, tmp_path, observed_runs):
    """Each of the 8 candidates planned with its settings fixed and measured here, against the
    float32 graph of the model (an unequalized plan's reference): the plan left to choose is the
    best one's, and it records every other candidate's cosine (or a bound above it, when judging
    stopped at a sample below the best). The choice ran one calibration for all 8."""
    calibration = _calibration(tmp_path)
    samples = _samples(calibration)
    chosen = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration)
    assert len(observed_runs) == len(samples)
    fixed = {settings_label(settings): rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration,
                                                         **settings)
             for settings in candidates(INT8_SETTINGS)}
    unequalized = fixed[settings_label(PREFERRED_INT8)]
    reference = FloatReference(unequalized.reference_nodes, [s.device for s in unequalized.record.steps],
                               unequalized.record.model.opset, ["y"])
    cosines = {label: _worst_cosine(plan, reference, samples) for label, plan in fixed.items()}
    assert max(cosines.values()) - min(cosines.values()) > 1e-6  # the candidates differ
    best = max(cosines, key=cosines.get)  # the first of equals: candidates() lists by preference
    entry = _technique(chosen, "int8_settings")
    assert entry.applied == (best,) and f"{cosines[best]:.8f}" in entry.note
    assert chosen.record == dataclasses.replace(fixed[best].record,
                                                int8_techniques=(entry, *fixed[best].record.int8_techniques))
    assert chosen.weights == fixed[best].weights
    assert len(entry.declined) == 7
    for line in entry.declined:
        label, recorded = line.rsplit(": ", 1)
        if recorded.startswith("at most "):
            assert cosines[label] <= float(recorded.removeprefix("at most ")) + 1e-8
            assert float(recorded.removeprefix("at most ")) < cosines[best]
        else:
            assert abs(float(recorded) - cosines[label]) < 1e-7
    assert "int8 settings               " + entry.note in chosen.summary()


def test_a_setting_the_user_gives_is_not_searched(chain, tmp_path, capsys):
    calibration = _calibration(tmp_path)
    plan = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration, bias_correction=False)
    entry = _technique(plan, "int8_settings")
    labels = [*entry.applied, *(line.rsplit(": ", 1)[0] for line in entry.declined)]
    assert len(labels) == 4 and all("no bias correction" in label for label in labels)
    assert "searched: calibration method, equalization;" in entry.note
    # the command line's flags fix theirs alike; all three given, nothing is chosen
    json_path = tmp_path / "plan.json"
    assert main(["plan", str(chain), "--target", "rk3588", "--dtype", "int8", "--calib", str(calibration),
                 "--calib-method", "mmse", "--no-bias-correction", "--equalization", "--json", str(json_path)]) == 0
    assert "int8 settings" not in capsys.readouterr().out
    fixed = Options(dtype="int8", calibration=calibration, calibration_method="mmse", bias_correction=False,
                    equalization=True)
    assert rkcompile.load(json_path).record == compile_model(chain, "rk3588", fixed, runtime=EMULATOR_RUNTIME)[0]


def test_a_technique_that_changes_nothing_is_not_searched_and_one_calibration_serves_all(tmp_path, observed_runs):
    """One Conv has no pair to equalize: 4 candidates, not 8. The float32 calibration run happens
    once: both methods and both bias corrections read it."""
    weights = {"w": uneven((4, 3, 3, 3)), "b": np.ones(4, np.float32)}
    single = _save(tmp_path, "single", [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                   [1, 3, 16, 16], [1, 4, 16, 16], weights)
    calibration = _calibration(tmp_path)
    entry = _technique(rkcompile.compile(single, "rk3588", dtype="int8", calibration=calibration), "int8_settings")
    assert len(entry.declined) == 3 and "searched: calibration method, bias correction;" in entry.note
    assert len(observed_runs) == 3  # the 3 calibration samples once


def test_the_float32_reference_outputs_are_the_unequalized_calibration_runs(chain, tmp_path, monkeypatch):
    """The choice runs the float32 graph once per sample (the one calibration) and no more (and
    the first plan's rounded graph once per sample, for the judging order): the judge's
    reference outputs are those the calibration computed on the model's own weights,
    its graph computing alike (`FloatReference.same_outputs`); the choice is the one the first
    test checks against a reference run of its own."""
    calibration = _calibration(tmp_path)
    samples = _samples(calibration)
    runs, run = [], FloatReference.run
    monkeypatch.setattr(FloatReference, "run", lambda self, *args, **kwargs: runs.append(self) or run(self, *args, **kwargs))
    taken, calibrated = [], Judge.calibrated_outputs
    monkeypatch.setattr(Judge, "calibrated_outputs",
                        lambda self, reference: taken.append(calibrated(self, reference)) or taken[-1])
    rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration)
    rounded = [graph for graph in runs if any(node.op == "QuantizeLinear" for node in graph.nodes)]
    assert len(runs) - len(rounded) == len(samples) and len(taken) == 1 and len(taken[0]) == len(samples)
    assert len(rounded) == len(samples)  # the judging order's runs (`Judge.hardest_first`)
    plan = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration, **PREFERRED_INT8)
    reference = FloatReference(plan.reference_nodes, [s.device for s in plan.record.steps], plan.record.model.opset, ["y"])
    for sample, expected in zip(samples, taken[0]):
        assert np.array_equal(reference.run(sample)["y"], expected["y"])


def test_float_graphs_share_outputs_only_when_they_compute_alike():
    """Renamed nodes and constants compute alike; another constant value, another op or an
    unrun graph do not."""
    from rkcompile.plan.plain_nodes import Constant, Node, Variable

    def graph(scale: float, op: str = "Mul", names: str = "a") -> FloatReference:
        node = Node(op, f"node_{names}", {}, [Variable("x"), Constant(f"k_{names}", np.array(scale, np.float32))],
                    [Variable("y")])
        return FloatReference([node], ["npu"], 17, ["y"])

    sample = {"x": np.arange(4, dtype=np.float32)}
    ran = graph(2.0)
    ran.run(sample)
    assert graph(2.0, names="b").same_outputs(ran, sample)
    assert not graph(3.0).same_outputs(ran, sample) and not graph(2.0, "Add").same_outputs(ran, sample)
    assert not ran.same_outputs(graph(2.0), sample)  # the other never ran on such feeds


class MatrixJudge(Judge):
    """A Judge whose plans are the candidates' settings and whose runs read a cosine per
    candidate and sample from `cosine(settings, index)`; it counts the runs."""

    def __init__(self, cosine, count: int, hardest: list[int] | None = None, weight_bytes: int = 1):
        options = Options(dtype="int8", calibration_method=CHOOSE, bias_correction=CHOOSE, equalization=CHOOSE)
        runtime = SimpleNamespace(run=lambda plan, sample: {"y": cosine(plan.settings, sample["index"])},
                                  cosine=lambda name, actual, expected: actual)
        super().__init__(SimpleNamespace(idle_techniques=set, options=options), runtime,
                         [{"index": index} for index in range(count)])
        self.runs = 0
        self.hardest, self.weight_bytes = hardest, weight_bytes

    def hardest_first(self, plan):
        """The order a rounded run would give: `hardest` when given."""
        return None if self.hardest is None else list(self.hardest)

    def planned(self, tensors, settings=None):
        record = SimpleNamespace(memory=SimpleNamespace(weight_bytes=self.weight_bytes))
        return SimpleNamespace(settings=dict(settings), record=record), None

    def expected_outputs(self, plan):
        return [{"y": np.full(4, 1.0 + index)} for index in range(len(self.given_samples))]

    def sample_cosine(self, tensors, settings, index):
        self.runs += index not in self.sample_cosines.get(self.key(tensors, settings), {})
        return super().sample_cosine(tensors, settings, index)


def _label(settings) -> tuple:
    return settings["calibration_method"], settings["bias_correction"], settings["equalization"]


@pytest.mark.parametrize("cosines, expected", [
    ({}, PREFERRED_INT8),  # all equal: the preferred settings
    ({("mmse", False, True): 0.9, ("minmax", False, True): 0.9}, dict(calibration_method="minmax",
                                                                      bias_correction=False, equalization=True)),
    ({("mmse", True, False): 0.9}, dict(calibration_method="mmse", bias_correction=True, equalization=False)),
])
def test_ties_keep_the_candidate_listed_first(cosines, expected):
    """Judged in an order whose first plan calibrates for all, chosen by cosine, a tie going to
    the candidate INT8_SETTINGS lists first (the preferred values are the first of each)."""
    judge = MatrixJudge(lambda settings, index: cosines.get(_label(settings), 0.5), 3)
    settings, entry = choose_settings(judge, judge.planner.options, lambda text: None)
    assert settings == expected and entry.applied == (settings_label(expected),)


@pytest.mark.parametrize("seed", range(6))
def test_the_choice_runs_every_sample_of_the_winner_only_and_chooses_as_judging_all(seed):
    """Cosines per candidate and sample with the spread of real ones (a shared per-sample
    difficulty plus each candidate's own noise): the choice is the candidate whose worst over
    every sample is best (ties to the first listed), each other stopped below it, and far fewer
    runs than every candidate on every sample."""
    random = np.random.default_rng(seed)
    count = 32
    difficulty = random.uniform(0, 0.004, count)
    table = {_label(settings): 0.99 - difficulty - random.uniform(0, 0.003, count) - random.uniform(0, 0.002)
             for settings in candidates(INT8_SETTINGS)}
    table[_label(PREFERRED_INT8)] = table[("mmse", True, False)].copy() if seed % 2 else table[_label(PREFERRED_INT8)]
    judge = MatrixJudge(lambda settings, index: table[_label(settings)][index], count)
    settings, entry = choose_settings(judge, judge.planner.options, lambda text: None)
    worst = {label: float(values.min()) for label, values in table.items()}
    best = max(candidates(INT8_SETTINGS), key=lambda c: (worst[_label(c)], -candidates(INT8_SETTINGS).index(c)))
    assert settings == best and f"{worst[_label(best)]:.8f}" in entry.note
    assert judge.sample_cosines[judge.key((), best)].keys() == set(range(count))
    for other in candidates(INT8_SETTINGS):
        if other != best:
            cosine, complete = judge.cosines[judge.key((), other)]
            assert cosine >= worst[_label(other)] and (complete or cosine < worst[_label(best)])
    assert judge.runs < 0.5 * len(table) * count


@pytest.mark.parametrize("seed", range(6))
def test_hard_samples_first_change_no_choice_and_cost_fewer_runs(seed):
    """A judging order with the hard samples first (`Judge.hardest_first`, from the first plan's
    rounded float run) meets the samples that stop losing candidates in their first runs: the
    same choice and winner's cosines, in fewer runs over the seeds."""
    random = np.random.default_rng(seed)
    count = 32
    difficulty = random.uniform(0, 0.004, count)
    table = {_label(settings): 0.99 - difficulty - random.uniform(0, 0.003, count) - random.uniform(0, 0.002)
             for settings in candidates(INT8_SETTINGS)}
    plain = MatrixJudge(lambda settings, index: table[_label(settings)][index], count)
    ordered = MatrixJudge(lambda settings, index: table[_label(settings)][index], count,
                          hardest=list(np.argsort(-difficulty)))
    chosen = [choose_settings(judge, judge.planner.options, lambda text: None) for judge in (plain, ordered)]
    assert chosen[0][0] == chosen[1][0] and chosen[0][1].note == chosen[1][1].note  # the others' bounds move
    key = plain.key((), chosen[0][0])
    assert plain.sample_cosines[key] == ordered.sample_cosines[key]
    assert ordered.runs < plain.runs


def test_candidates_start_on_samples_none_ran_then_run_the_one_furthest_below_a_best():
    """A candidate yet to run starts where no candidate ran; one that ran goes next to the sample
    some candidate found furthest below its own best, not to the lowest cosine (a weaker
    candidate's ordinary sample), then to the first none ran in the judge's order."""
    judge = SimpleNamespace(given_samples=[{}] * 6, order=list(range(6)), sample_cosines={
        "strong": {0: 0.990, 1: 0.985},  # sample 1: 0.005 below its best
        "weak": {2: 0.950, 3: 0.949},  # sample 3: the lowest cosine, 0.001 below its best
        "asked": {},
    })
    assert next_sample(judge, {}) == 4
    assert next_sample(judge, {0: 0.99}) == 1
    assert next_sample(judge, {0: 0.99, 1: 0.98, 3: 0.95, 2: 0.96}) == 4
    judge.order = [0, 1, 2, 3, 5, 4]  # the judging order decides among samples none ran
    assert next_sample(judge, {}) == 5 and next_sample(judge, {0: 0.99, 1: 0.98, 3: 0.95, 2: 0.96}) == 5
    judge.sample_cosines["others"] = {4: 0.97, 5: 0.97}
    assert next_sample(judge, {}) == 1  # every sample ran: the hardest-looking one


@pytest.mark.parametrize("seed", range(4))
def test_runs_ahead_change_neither_the_choice_nor_any_recorded_cosine(seed):
    """A runtime that runs ahead (`run_ahead`: the leader's next sample while it runs this one)
    gives the same choice, the same entry and the same per-sample cosines as one that runs each
    sample when asked; the runs made ahead that the order asks for are taken up, not run again."""
    random = np.random.default_rng(seed)
    count = 32
    difficulty = random.uniform(0, 0.004, count)
    table = {_label(settings): 0.99 - difficulty - random.uniform(0, 0.003, count) - random.uniform(0, 0.002)
             for settings in candidates(INT8_SETTINGS)}
    class Busy(Future):
        """A run the other thread is still making until it is asked for: meanwhile the judge
        makes the run likely to follow on its own thread (`run_ahead(here=True)`)."""

        def __init__(self, make):
            super().__init__()
            self.make = make

        def result(self, timeout=None):
            if not self.done():
                self.set_result(self.make())
            return super().result(timeout)

    found = []
    for ahead in (None, "done", "busy"):
        judge = MatrixJudge(lambda settings, index: table[_label(settings)][index], count)
        run, asked, elsewhere = judge.runtime.run, [], []
        judge.runtime.run = lambda plan, sample: asked.append(sample["index"]) or run(plan, sample)
        if ahead:
            def run_ahead(plan, sample, busy=ahead == "busy"):
                elsewhere.append(sample["index"])
                future = Busy(lambda: run(plan, sample))
                if not busy:
                    future.result()
                return future
            judge.runtime.run_ahead = run_ahead
        found.append((*choose_settings(judge, judge.planner.options, lambda text: None), judge.sample_cosines))
        if ahead is None:
            assert len(asked) == judge.runs
        else:  # every run made once, on one thread or the other, most of them ahead of their turn
            assert len(asked) + len(elsewhere) >= judge.runs and 0 < len(asked) < judge.runs - count // 2
            assert len(elsewhere) > count // 4
    assert found[0] == found[1] == found[2]


def test_candidates_too_large_to_hold_together_run_ahead_only_their_own_samples():
    """Plans whose weights the judge cannot hold all at once (`KEPT_WEIGHT_BYTES`) are made as
    each leads: a run made ahead is then the leader's own next sample, never another candidate's
    (whose plan would push the leader's out), and the choice is the same."""
    from rkcompile.compiler.auto_float16 import KEPT_WEIGHT_BYTES

    random = np.random.default_rng(5)
    count = 16
    table = {_label(settings): 0.99 - random.uniform(0, 0.004, count) for settings in candidates(INT8_SETTINGS)}
    found, others_ahead = [], []
    for weight_bytes in (1, KEPT_WEIGHT_BYTES):
        judge = MatrixJudge(lambda settings, index: table[_label(settings)][index], count, weight_bytes=weight_bytes)
        events = []
        asked = judge.sample_cosine

        def sample_cosine(tensors, settings, index, asked=asked, events=events):
            events.append(("asked", _label(settings)))
            return asked(tensors, settings, index)

        def run_ahead(plan, sample, judge=judge, events=events):
            events.append(("ahead", _label(plan.settings)))
            future = Future()
            future.set_result(judge.runtime.run(plan, sample))
            return future
        judge.sample_cosine, judge.runtime.run_ahead = sample_cosine, run_ahead
        found.append(choose_settings(judge, judge.planner.options, lambda text: None))
        # a run made ahead for another candidate than the one asked next
        others_ahead.append(sum(kind == "ahead" and events[i + 1] != ("asked", label)
                                for i, (kind, label) in enumerate(events[:-1])))
    assert found[0] == found[1]
    assert others_ahead[0] > 0 and others_ahead[1] == 0

def test_the_choice_plans_and_runs_inside_the_runtimes_two_at_a_time_context():
    """A runtime with `two_at_a_time` has the context entered before the first plan (its worker
    starts while that plan calibrates) and left after the last run, every plan and run inside."""
    import contextlib

    judge = MatrixJudge(lambda settings, index: 0.99 - 0.001 * index, 8)
    events = []

    @contextlib.contextmanager
    def two_at_a_time():
        events.append("enter")
        yield
        events.append("exit")

    planned, run = judge.planned, judge.runtime.run
    judge.planned = lambda tensors, settings=None: events.append("plan") or planned(tensors, settings)
    judge.runtime.run = lambda plan, sample: events.append("run") or run(plan, sample)
    judge.runtime.two_at_a_time = two_at_a_time
    choose_settings(judge, judge.planner.options, lambda text: None)
    inside = events[events.index("enter") + 1:events.index("exit")]
    assert events[0] == "enter" and "run" in inside and "plan" in inside
    assert "run" not in events[events.index("exit"):]
