"""Version maps and bisect: the pure rules (regimes, change points, where a bisect goes next) and
the drivers (saving after every trial, continuing a folder), with a trial function standing in
for the audit or a cell: what is tested here is the walk, not what a trial finds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.cli import main
from bench.core.verdicts import Reason
from bench.versions.model import (
    BisectError,
    Kind,
    Outcome,
    Plan,
    VersionMap,
    bisect_state,
    cell_kind,
    change_points,
    mostly_empty,
    regimes,
    settled,
)
from bench.versions.render import markdown
from bench.versions.trial import VersionsError, open_map, run_bisect, run_map, write_versions
from bench.weights.overlays import OverlayError, select_versions

VERSIONS = [f"1.{i}" for i in range(10)]


def outcome(version: str, kind: Kind, runs: int = 1) -> Outcome:
    return Outcome(version=version, kind=kind, runs=runs, failures=0 if kind.good else runs)


def test_regimes_group_adjacent_versions_and_name_each_change():
    kinds = [Kind.FAILS_AT_LOAD] * 2 + [Kind.LOSES_WEIGHTS] + [Kind.FAILS_AT_LOAD] + [Kind.PASSES] * 2
    outs = [outcome(v, k) for v, k in zip(VERSIONS, kinds)]
    assert [(r.span, r.kind) for r in regimes(outs)] == [
        ("1.0 – 1.1", Kind.FAILS_AT_LOAD), ("1.2", Kind.LOSES_WEIGHTS), ("1.3", Kind.FAILS_AT_LOAD),
        ("1.4 – 1.5", Kind.PASSES)]
    assert [c.describe() for c in change_points(outs)] == [
        "1.1 → 1.2: fails loudly at load → loses weights silently",
        "1.2 → 1.3: loses weights silently → fails loudly at load",
        "1.3 → 1.4: fails loudly at load → passes"]


def test_a_version_the_trial_cannot_tell_is_neither_good_nor_bad():
    assert Kind.UNSUPPORTED.good is None and Kind.NOT_INSTALLED.good is None
    assert Kind.PASSES.good is True and all(k.good is False for k in (Kind.LOSES_WEIGHTS, Kind.EMPTY_COMPLETIONS))
    assert outcome("1.0", Kind.UNSUPPORTED).sureness(0.5) == "cannot tell"


def test_a_passing_version_is_as_sure_as_its_runs_and_one_failure_settles():
    plan = Plan(rate=0.5, confidence=0.95)
    assert plan.repeats == 5
    assert [settled(0, n, plan) for n in range(1, 6)] == [False] * 4 + [True]
    assert settled(1, 1, plan)
    assert "probability 97%" in outcome("1.0", Kind.PASSES, runs=5).sureness(0.5)
    assert "failed 1 of 1" in outcome("1.0", Kind.EMPTY_COMPLETIONS).sureness(0.5)


def test_a_cells_kind_from_the_judges_reasons():
    assert cell_kind({Reason.BOOT_TIMEOUT, Reason.EMPTY_TEXT}) == Kind.BOOT_FAILS
    assert cell_kind({Reason.EMPTY_TEXT, Reason.WEIGHTS_LOST}) == Kind.EMPTY_COMPLETIONS
    assert cell_kind({Reason.WEIGHTS_LOST, Reason.DIVERGENCE}) == Kind.LOSES_WEIGHTS
    assert cell_kind({Reason.EXPECTATION_FAILED}) == Kind.WRONG_OUTPUTS
    assert cell_kind(set()) == Kind.PASSES
    # Empty text on a few prompts among right answers is a defect of those prompts, not a server
    # that answers empty.
    assert cell_kind({Reason.EMPTY_TEXT, Reason.TOKEN_NOT_ALLOWED}, mostly_empty=False) == Kind.WRONG_OUTPUTS


def test_empty_completions_are_most_of_a_runs_answers():
    from bench.core.evidence import EmptyText
    from bench.core.records import CellSummary, RunResult
    from bench.core.verdicts import Finding, Verdict

    def cell(*empty_per_run: int) -> CellSummary:
        runs = [RunResult(repeat=i, reasons=[Reason.EMPTY_TEXT] if k else [], findings=[
            Finding(reason=Reason.EMPTY_TEXT, evidence=EmptyText(completion_tokens=8, finish_reason="length"),
                    prompt_id=f"p{j}") for j in range(k)]) for i, k in enumerate(empty_per_run, 1)]
        return CellSummary(cell_id="c", model="m", load_format="f", platform="cpu", image="i", baseline_id=None,
                           runs=len(runs), failures=sum(1 for k in empty_per_run if k), verdict=Verdict.FAIL,
                           reasons={Reason.EMPTY_TEXT: 1}, run_results=runs)

    assert mostly_empty(cell(0, 7), prompts=12)  # one run of 12 prompts answered 7 empty
    assert not mostly_empty(cell(1, 6), prompts=12)  # one prompt's empty answer; half is not most
    assert not mostly_empty(cell(), prompts=3)


def walk(versions, good, bad, truth, limit=100):
    """Runs a bisect to its end against `truth` (version -> kind); returns the versions it tried and the last state."""
    outcomes: dict[str, Outcome] = {}
    tried = []
    state = bisect_state(versions, good, bad, outcomes)
    while state.next is not None and len(tried) < limit:
        tried.append(state.next)
        outcomes[state.next] = outcome(state.next, truth[state.next])
        state = bisect_state(versions, good, bad, outcomes)
    return tried, state


def test_bisect_tries_both_ends_then_halves():
    truth = {v: Kind.LOSES_WEIGHTS if i < 7 else Kind.PASSES for i, v in enumerate(VERSIONS)}
    tried, state = walk(VERSIONS, "1.9", "1.0", truth)
    assert tried[:2] == ["1.9", "1.0"]
    assert state.change is not None and (state.change.before, state.change.after) == ("1.6", "1.7")
    assert state.change.describe() == "1.6 → 1.7: loses weights silently → passes"  # in version order
    assert len(tried) <= 2 + math.ceil(math.log2(len(VERSIONS) - 2)) < len(VERSIONS)


def test_bisect_steps_over_versions_it_cannot_tell_and_names_them():
    truth = {v: Kind.PASSES if i < 3 else Kind.UNSUPPORTED if i < 6 else Kind.EMPTY_COMPLETIONS
             for i, v in enumerate(VERSIONS)}
    _tried, state = walk(VERSIONS, "1.0", "1.9", truth)
    assert state.change is not None
    assert (state.change.before, state.change.after, state.change.untested) == ("1.2", "1.6", ["1.3", "1.4", "1.5"])
    assert "untested between them" in state.change.describe()


@pytest.mark.parametrize(("good_kind", "bad_kind", "says"), [
    (Kind.EMPTY_COMPLETIONS, Kind.EMPTY_COMPLETIONS, "the good end 1.0 does not pass"),
    (Kind.PASSES, Kind.PASSES, "no change between 1.0 and 1.9: the bad end passes too"),
    (Kind.PASSES, Kind.UNSUPPORTED, "the bad end cannot be told"),
])
def test_bisect_ends_that_do_not_differ_are_said_plainly(good_kind, bad_kind, says):
    truth = {v: good_kind for v in VERSIONS} | {"1.9": bad_kind}
    tried, state = walk(VERSIONS, "1.0", "1.9", truth)
    assert tried == ["1.0", "1.9"] and state.change is None and says in state.verdict


def test_bisect_ends_must_be_two_known_versions():
    with pytest.raises(BisectError, match="not one of the versions"):
        bisect_state(VERSIONS, "2.0", "1.0", {})
    with pytest.raises(BisectError, match="same version"):
        bisect_state(VERSIONS, "1.0", "1.0", {})


@given(st.integers(min_value=2, max_value=60), st.data())
def test_bisect_finds_the_one_change_of_any_monotone_range_in_logarithmic_trials(n, data):
    versions = [f"0.{i}" for i in range(n)]
    change = data.draw(st.integers(min_value=1, max_value=n - 1))
    fixed = data.draw(st.booleans())  # searching for a fix (bad end older) or a regression
    truth = {v: (Kind.PASSES if (i >= change) == fixed else Kind.LOSES_WEIGHTS) for i, v in enumerate(versions)}
    good, bad = (versions[-1], versions[0]) if fixed else (versions[0], versions[-1])
    tried, state = walk(versions, good, bad, truth)
    assert state.change is not None
    assert (state.change.before, state.change.after) == (versions[change - 1], versions[change])
    assert len(tried) <= 2 + math.ceil(math.log2(n - 1))  # m versions inside: ceil(log2(m + 1))
    assert len(set(tried)) == len(tried)


# --- the drivers --------------------------------------------------------------------------------


def fresh(mode="map", versions=VERSIONS, good=None, bad=None) -> VersionMap:
    return VersionMap(mode=mode, axis="runai-model-streamer", trial="made up", versions=versions,
                      plan=Plan(rate=1.0, confidence=0.95), outcomes=[], good=good, bad=bad)


class Trial:
    """Stands in for the audit or a cell: answers from `truth`, counts its calls, and can be told
    to come back unsettled (an interrupt) at its n-th call."""

    def __init__(self, truth, interrupt_at=None):
        self.truth, self.interrupt_at, self.calls = truth, interrupt_at, []

    def __call__(self, version: str, folder: Path, plan: Plan):
        self.calls.append(version)
        if len(self.calls) == self.interrupt_at:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        return outcome(version, self.truth[version]).model_copy(update={"folder": f"{folder.parent.name}/{version}"})


def test_an_interrupted_map_keeps_what_it_tried_and_the_same_folder_continues(tmp_path):
    truth = {v: Kind.LOSES_WEIGHTS if i < 4 else Kind.PASSES for i, v in enumerate(VERSIONS)}
    saved = []
    trial = Trial(truth, interrupt_at=7)
    first = run_map(trial, tmp_path, open_map(tmp_path, fresh()), lambda m: (saved.append(m), write_versions(tmp_path, m)))
    assert first.interrupted and [o.version for o in first.outcomes] == VERSIONS[:6]
    assert len(saved) >= 6 and "Interrupted" in (tmp_path / "summary.md").read_text()
    again = Trial(truth)
    second = run_map(again, tmp_path, open_map(tmp_path, fresh()), lambda m: write_versions(tmp_path, m))
    assert again.calls == VERSIONS[6:]  # nothing tried twice
    assert not second.interrupted and [o.version for o in second.in_order()] == VERSIONS
    assert [r.span for r in second.regimes] == ["1.0 – 1.3", "1.4 – 1.9"]
    text = (tmp_path / "summary.md").read_text()
    assert "| 1.0 – 1.3 | loses weights silently |" in text and "1.3 → 1.4" in text


def test_a_bisect_resumes_from_its_trial_folders_and_reports_every_trial(tmp_path):
    truth = {v: Kind.EMPTY_COMPLETIONS if i < 6 else Kind.PASSES for i, v in enumerate(VERSIONS)}
    start = fresh("bisect", good="1.9", bad="1.0")
    first = run_bisect(Trial(truth, interrupt_at=3), tmp_path, open_map(tmp_path, start),
                       lambda m: write_versions(tmp_path, m))
    assert first.interrupted and [o.version for o in first.outcomes] == ["1.9", "1.0"]
    again = Trial(truth)
    done = run_bisect(again, tmp_path, open_map(tmp_path, start), lambda m: write_versions(tmp_path, m))
    assert "1.9" not in again.calls and "1.0" not in again.calls
    assert done.bisect is not None and done.bisect.change is not None
    assert (done.bisect.change.before, done.bisect.change.after) == ("1.5", "1.6")
    text = markdown(done)
    assert f"{len(done.outcomes)} trial(s) for 10 versions" in text
    assert all(f"| {o.version} |" in text for o in done.outcomes)


def test_a_map_from_before_trials_had_their_name_reads_and_continues_in_its_own_folders(tmp_path):
    truth = {v: Kind.PASSES for v in VERSIONS}
    save = lambda m: write_versions(tmp_path, m)  # noqa: E731
    run_map(Trial(truth, interrupt_at=4), tmp_path, open_map(tmp_path, fresh()), save)
    written = json.loads((tmp_path / "versions.json").read_text())
    assert written["trial"] == "made up" and "probe" not in written
    assert sorted(p.name for p in (tmp_path / "trials").iterdir()) == VERSIONS[:3]
    # As an older regbench wrote it: the key and the folder said "probe".
    (tmp_path / "trials").rename(tmp_path / "probes")
    written["probe"] = written.pop("trial")
    for o in written["outcomes"]:
        o["folder"] = o["folder"].replace("trials/", "probes/")
    (tmp_path / "versions.json").write_text(json.dumps(written))
    again = Trial(truth)
    done = run_map(again, tmp_path, open_map(tmp_path, fresh()), save)
    assert again.calls == VERSIONS[3:]  # the old folders' outcomes were read, none tried again
    assert not (tmp_path / "trials").exists()
    assert sorted(p.name for p in (tmp_path / "probes").iterdir()) == VERSIONS
    assert [o.folder for o in done.in_order()] == [f"probes/{v}" for v in VERSIONS]
    assert json.loads((tmp_path / "versions.json").read_text())["trial"] == "made up"


def test_a_folder_holding_another_question_is_refused(tmp_path):
    write_versions(tmp_path, fresh())
    with pytest.raises(VersionsError, match="versions differ"):
        open_map(tmp_path, fresh(versions=VERSIONS[:3]))


def test_version_lists_and_ranges():
    available = ["0.13.0", "0.13.1", "0.14.0", "0.15.0rc1", "0.15.0", "0.16.0"]
    assert select_versions("0.13.1..0.15.0", available) == ["0.13.1", "0.14.0", "0.15.0"]
    assert select_versions("0.16.0, 0.13.0", None) == ["0.16.0", "0.13.0"]
    for bad in ("0.13.0,0.13.0", "0.9..0.10", "a b"):
        with pytest.raises(OverlayError):
            select_versions(bad, available)


@pytest.mark.parametrize(("args", "says"), [
    (["versions", "--streamer", "0.16.0"], "--audit CKPT"),
    (["versions", "--audit", "x", "--config", "y", "--streamer", "0.16.0"], "--audit CKPT"),
    (["versions", "--audit", "x"], "--streamer VERSIONS or --images"),
    (["versions", "--audit", "x", "--images", "a"], "--images needs a matrix"),
    (["bisect", "--good", "0.1", "--bad", "0.2", "--audit", ".", "--streamer", "0.1,0.3"], "--bad 0.2"),
])
def test_versions_usage_errors_exit_2(args, says, capsys):
    assert main(args) == 2
    assert says in capsys.readouterr().err
