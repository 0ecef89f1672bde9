"""The version map and bisect with the weight audit, on every runai-model-streamer release from
0.13.0 to the newest the index has (overlays installed on demand), checked against a direct
audit of each release: nothing about the releases is written here.

Full tier (scripts/test.sh --full): the release map, no server, but ~20 overlays to install (a few
MB each) and ~20 audits of 2 s. The landing tier maps a release the reader cannot drive here, and
bisects the smoke matrix's three releases with servers (tests/test_e2e_versions.py).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bench.cli import main
from bench.versions.model import Kind, VersionMap
from bench.weights.audit import audit_checkpoint, default_python
from bench.weights.overlays import available_versions, ensure_overlay

from .support import CANARY, STREAMERS

pytestmark = pytest.mark.slow
ORDERS = ["sorted", "listing"]


def run(*args: str) -> int:
    return main([*args, "--audit", str(CANARY), "--overlays", str(STREAMERS), "--rate", "1"])


@pytest.fixture(scope="module")
def releases() -> list[str]:
    from packaging.version import Version

    return [v for v in available_versions(default_python()) if Version(v) >= Version("0.13.0")]


@pytest.fixture(scope="module")
def version_map(releases, tmp_path_factory) -> VersionMap:
    folder = tmp_path_factory.mktemp("map")
    assert run("versions", "--streamer", f"0.13.0..{releases[-1]}", "--dir", str(folder)) == 0
    return VersionMap.model_validate_json((folder / "versions.json").read_text())


def direct(version: str) -> str:
    """What a plain audit of the release says, in the map's words, from the runs' raw fields."""
    report = audit_checkpoint(CANARY, default_python(), [str(ensure_overlay(default_python(), STREAMERS, version))],
                              {}, orders=ORDERS, loaders=["streamer"])
    runs = report.runs
    if all(r.delivered == r.expected and not r.error and not r.missing for r in runs):
        return "passes"
    if any(r.missing and r.error is None and r.unsupported is None for r in runs):
        return "loses weights silently"
    if any(r.error for r in runs):
        return "fails loudly at load"
    return "?"


@pytest.mark.full
def test_the_map_covers_every_release_and_agrees_with_a_direct_audit_of_each(version_map, releases):
    assert version_map.versions == releases
    assert [o.version for o in version_map.in_order()] == releases
    for o in version_map.outcomes:
        assert o.kind.words == direct(o.version), o.version
        assert "unexpected keyword argument" not in o.detail and "no attribute 'stream_files'" not in o.detail
    # Regimes are maximal runs of one outcome, and change points sit between them.
    regimes = version_map.regimes
    assert all(a.kind != b.kind for a, b in itertools.pairwise(regimes))
    assert sum(len(r.versions) for r in regimes) == len(releases)
    assert len(version_map.change_points) == len(regimes) - 1
    print("\n".join(f"{r.span}: {r.kind.words}" for r in regimes))


def test_a_release_the_reader_cannot_call_is_mapped_as_such(tmp_path):
    # 0.5.0 predates SafetensorsStreamer: the reader cannot drive it.
    assert run("versions", "--streamer", "0.5.0", "--dir", str(tmp_path)) == 0
    vmap = VersionMap.model_validate_json((tmp_path / "versions.json").read_text())
    [o] = vmap.outcomes
    assert o.kind == Kind.UNSUPPORTED and "SafetensorsStreamer" in o.detail
    assert "the reader cannot drive this loader version" in (tmp_path / "summary.md").read_text()


@pytest.mark.full
def test_bisect_finds_a_change_point_of_the_map_with_fewer_trials(version_map, releases, tmp_path, capsys):
    passing = [o.version for o in version_map.in_order() if o.kind == Kind.PASSES]
    failing = [o.version for o in version_map.in_order() if o.good is False]
    assert passing and failing, "the canary needs a passing and a failing release"
    good, bad = passing[-1], failing[0]
    assert run("bisect", "--streamer", f"0.13.0..{releases[-1]}", "--good", good, "--bad", bad,
               "--dir", str(tmp_path)) == 0
    vmap = VersionMap.model_validate_json((tmp_path / "versions.json").read_text())
    assert vmap.bisect is not None and vmap.bisect.change is not None
    change = vmap.bisect.change
    assert (change.before, change.after) in {(c.before, c.after) for c in version_map.change_points}
    assert len(vmap.outcomes) < len(version_map.outcomes)
    printed = capsys.readouterr().out
    assert f"{len(vmap.outcomes)} trial(s) for {len(releases)} versions" in printed
    # Every trial is kept: its folder holds the audit it ran.
    for o in vmap.outcomes:
        assert list(Path(tmp_path, o.folder).glob("audit-*.json"))
