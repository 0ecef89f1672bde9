"""Hub ids and hub cache snapshots, on a real hub cache built here from the tiny canary
(tests/hubcache.py) and read by huggingface_hub itself, offline: nothing is fetched from a hub."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import yaml
from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache

from bench import cli
from bench.commands import run as run_command
from bench.core.config import ConfigError, parse_config
from bench.core.matrix import expand
from bench.runner import prepare, run_matrix
from bench.serve.launch_docker import checkpoint_mounts, container_model_path, mounts
from bench.store.matrixfile import load_config
from bench.store.results import ResultsDir
from bench.weights import hub
from bench.weights.hub import HubError, resolve_models

from .hubcache import add_revision, hub_cache
from .support import CANARY, ScriptedLauncher, needs_canary

pytestmark = needs_canary
REPO = "regbench-test/tiny-canary"


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "hf" / "hub"


@pytest.fixture
def snap(cache):
    return hub_cache(cache, REPO, CANARY)


def hub_config(minimal, cache: Path, **model):
    minimal["models"] = [{"name": "tiny", "path": REPO, **model}]
    minimal["exclude"] = [{"load_format": "runai_streamer"}]
    minimal["server"] = {"hub_cache": str(cache.parent)}
    minimal["workload"]["min_tokens"] = minimal["workload"]["max_tokens"] = 16
    return parse_config(minimal)


OFFLINE = {"HF_HUB_OFFLINE": "1"}


def test_the_built_cache_is_what_huggingface_hub_reads_offline(snap, cache):
    # huggingface_hub itself, with the network off, finds the snapshot, every file and its blob.
    got = snapshot_download(REPO, cache_dir=cache, local_files_only=True)
    assert Path(got) == snap.path and snap.path.name == snap.commit and len(snap.commit) == 40
    assert (snap.repo_folder / "refs" / "main").read_text() == snap.commit
    for f in CANARY.iterdir():
        cached = try_to_load_from_cache(REPO, f.name, cache_dir=cache)
        assert isinstance(cached, str) and Path(cached).read_bytes() == f.read_bytes(), f.name
        link = snap.path / f.name
        assert link.is_symlink() and os.readlink(link).startswith("../../blobs/")
        blob = Path(os.path.realpath(link)).name
        if f.suffix == ".safetensors":  # LFS: named by sha256; the rest by their git blob hash
            assert blob == hashlib.sha256(f.read_bytes()).hexdigest()
        else:
            data = f.read_bytes()
            assert blob == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    (repo,) = scan_cache_dir(cache).repos
    # The four empty shards are one blob, as on the hub (a blob is its content).
    unique = {f.read_bytes() for f in CANARY.iterdir()}
    assert (repo.repo_id, repo.size_on_disk, repo.nb_files) == (REPO, sum(map(len, unique)), len(unique))
    (revision,) = repo.revisions
    assert (revision.commit_hash, revision.refs, revision.nb_files) == (snap.commit, {"main"}, len(list(CANARY.iterdir())))
    # Its completeness check reads the tree listing: a missing file makes the snapshot incomplete.
    (snap.path / "config.json").unlink()
    with pytest.raises(Exception, match="incomplete"):
        snapshot_download(REPO, cache_dir=cache, local_files_only=True)


def test_a_hub_id_resolves_offline_from_the_cache_and_the_commit_is_recorded(minimal, snap, cache):
    cfg = hub_config(minimal, cache)
    said: list[str] = []
    cells, records = resolve_models(cfg, expand(cfg), OFFLINE, said.append)
    assert {c.model.path for c in cells} == {str(snap.path)}
    (record,) = records
    assert (record.kind, record.model, record.ok) == ("fetch", "tiny", True)
    assert record.notes[0] == f"hub id {REPO} at main: commit {snap.commit}"
    assert (record.hub_id, record.revision, record.commit) == (REPO, "main", snap.commit)  # what a run keys it on
    assert record.notes[1] == f"snapshot {snap.path}"
    assert "from the cache (HF_HUB_OFFLINE)" in record.notes[2]
    assert any(snap.commit in line for line in said)
    # Local models pass through untouched, and nothing is resolved twice.
    again, none = resolve_models(cfg, cells, OFFLINE, said.append)
    assert again == cells and none == []


def test_the_default_cache_is_huggingface_hubs_read_when_the_bench_runs(minimal, snap, cache):
    minimal["server"] = {}
    cfg = hub_config(minimal, cache)
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"hub_cache": None})})
    cells, _ = resolve_models(cfg, expand(cfg), {**OFFLINE, "HF_HUB_CACHE": str(cache)}, lambda s: None)
    assert cells[0].model.path == str(snap.path)
    cells, _ = resolve_models(cfg, expand(cfg), {**OFFLINE, "HF_HOME": str(cache.parent)}, lambda s: None)
    assert cells[0].model.path == str(snap.path)


def test_a_revision_resolves_to_its_commit(minimal, snap, cache):
    tagged = add_revision(cache, REPO, CANARY, "v1", {"generation_config.json": b'{"do_sample": false}\n'})
    assert tagged.commit != snap.commit
    for revision, commit in (("v1", tagged.commit), ("main", snap.commit), (snap.commit, snap.commit)):
        cfg = hub_config(minimal, cache, revision=revision)
        cells, (record,) = resolve_models(cfg, expand(cfg), OFFLINE, lambda s: None)
        assert cells[0].model.path == str(cache / "models--regbench-test--tiny-canary" / "snapshots" / commit)
        assert record.notes[0] == f"hub id {REPO} at {revision}: commit {commit}"


def test_offline_with_nothing_cached_is_a_config_error_naming_the_model_and_the_hub_id(minimal, cache):
    cfg = hub_config(minimal, cache)
    with pytest.raises(HubError) as caught:
        resolve_models(cfg, expand(cfg), OFFLINE, lambda s: None)
    assert isinstance(caught.value, ConfigError)
    message = str(caught.value)
    assert message.startswith("models.0.path: model 'tiny', hub id 'regbench-test/tiny-canary'")
    assert "HF_HUB_OFFLINE" in message and str(cache) in message


def test_an_unknown_revision_offline_names_the_revision(minimal, snap, cache):
    cfg = hub_config(minimal, cache, revision="no-such-tag")
    with pytest.raises(HubError, match=r"models\.0\.path: .* at revision 'no-such-tag': not in the hub cache"):
        resolve_models(cfg, expand(cfg), OFFLINE, lambda s: None)


def test_revision_is_a_model_key_and_only_for_hub_ids(minimal, tmp_path, cache):
    cfg = hub_config(minimal, cache, revision="v1")
    assert cfg.models[0].revision == "v1"
    with pytest.raises(ConfigError, match=r"models\.0\.revision"):
        parse_config(dict(minimal, models=[{"name": "m", "path": REPO, "revision": ""}]))
    local = parse_config(dict(minimal, models=[{"name": "m", "path": str(tmp_path), "revision": "v1"}]))
    with pytest.raises(HubError, match=r"^models\.0\.revision: only a hub id has revisions"):
        resolve_models(local, expand(local), OFFLINE, lambda s: None)


def test_a_run_resolves_before_the_pre_flight_which_then_inspects_the_snapshot(minimal, snap, cache, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = hub_config(minimal, cache)
    results = ResultsDir.create(tmp_path / "results", "r", cfg)
    run_matrix(cfg, expand(cfg), results, launcher=ScriptedLauncher(["ok"]))
    fetch, inspect = results.preflights()
    assert (fetch.kind, inspect.kind, inspect.model, inspect.ok) == ("fetch", "inspect", "tiny", True)
    assert fetch.notes[0].endswith(f"commit {snap.commit}")
    assert any("stream_stop_risk" in n for n in inspect.notes)  # the canary's empty shards, read through the links
    assert inspect.stream_stop_shards == ["model-00001-of-00010.safetensors"]  # first, in either order
    summary = (results.path / "summary.md").read_text()
    assert f"- fetch `tiny`: ok\n  - hub id {REPO} at main: commit {snap.commit}\n  - snapshot {snap.path}" in summary
    assert results.runs()[0].perf.checkpoint_bytes == sum(f.stat().st_size for f in CANARY.glob("*.safetensors"))
    # A resumed run resolves again and records nothing twice; another commit of the hub id is recorded.
    run_matrix(cfg, expand(cfg), results, launcher=ScriptedLauncher(["ok"]), done=frozenset({(expand(cfg)[0].id, 1)}))
    assert [p.kind for p in results.preflights()] == ["fetch", "inspect"]
    # Keyed on the typed fields, not on the wording of the notes.
    reworded = fetch.model_copy(update={"notes": ["the same resolution, said otherwise"]})
    moved = fetch.model_copy(update={"commit": "0" * 40, "notes": fetch.notes})
    prepare(cfg, expand(cfg), results, ScriptedLauncher(["ok"]), lambda s: None, fetched=[reworded, moved])
    assert [p.commit for p in results.preflights() if p.kind == "fetch"] == [snap.commit, "0" * 40]


def test_regbench_run_offline_without_the_model_exits_2_before_any_server(minimal, cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    minimal["models"] = [{"name": "tiny", "path": REPO}]
    minimal["server"] = {"hub_cache": str(cache.parent)}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(minimal))
    started = []
    monkeypatch.setattr(run_command, "open_launcher", lambda config, run_id: started.append(run_id) or ScriptedLauncher(["ok"]))
    code = cli.main(["run", str(tmp_path / "m.yaml"), "--results", str(tmp_path / "results"), "--run-id", "r"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "models.0.path: model 'tiny', hub id 'regbench-test/tiny-canary'" in " ".join(err.split())
    assert "Traceback" not in err
    assert not (tmp_path / "results" / "r" / "runs").exists() or not any((tmp_path / "results" / "r" / "runs").iterdir())


def test_plan_does_not_fetch(minimal, tmp_path, monkeypatch, capsys):
    def no_fetch(*args, **kwargs):
        raise AssertionError("plan fetched")

    monkeypatch.setattr(hub, "snapshot_download", no_fetch)
    minimal["models"] = [{"name": "tiny", "path": REPO, "revision": "v1"}]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(minimal))
    assert cli.main(["plan", str(tmp_path / "m.yaml")]) == 0
    assert load_config(tmp_path / "m.yaml").models[0].revision == "v1"


def test_a_snapshot_is_mounted_with_the_blobs_its_links_point_to(snap, minimal, tmp_path):
    container_path, volumes = checkpoint_mounts(str(snap.path), "/models/tiny")
    blobs = str(snap.repo_folder / "blobs")
    real = os.path.realpath(snap.path)
    assert container_path == real  # relative links resolve in the container as on this host
    assert volumes == {real: {"bind": real, "mode": "ro"}, os.path.realpath(blobs): {"bind": os.path.realpath(blobs),
                                                                                       "mode": "ro"}}
    # A plain folder is mounted where it always was.
    assert checkpoint_mounts(str(CANARY), "/models/tiny") == ("/models/tiny", {str(CANARY): {"bind": "/models/tiny",
                                                                                              "mode": "ro"}})
    cfg = parse_config(dict(minimal, models=[{"name": "tiny", "path": str(snap.path)}], launcher="docker",
                            images=[{"name": "img", "ref": "x"}]))
    cell = expand(cfg)[0]
    assert container_model_path(cell) == real and set(mounts(cell, None)) == {real, os.path.realpath(blobs)}
