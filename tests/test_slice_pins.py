"""The slices of one run on one build of a moving tag: `regbench plan --format pins` and `merge`,
against a real registry on 127.0.0.1 and the real Docker engine (the fixtures and the two tiny
builds of tests/test_registry.py: a server's container exits at once, so no vLLM boots and every
run is a boot failure; what is checked is which build each slice ran, from its fingerprint).

Each slice runs as a CI job does, `regbench run CONFIG --shard I/2 --run-id RUN`; the tag moves
between the two slices' starts, as a nightly's does between two jobs of one workflow run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker
import pytest
import yaml

from bench.store.results import ResultsDir

from . import test_registry
from .support import ROOT, needs_canary
from .test_registry import REPO, push, untag

# Its fixtures, as this module's: the registry, the engine and the two builds.
engine, registry, builds = test_registry.engine, test_registry.registry, test_registry.builds


def matrix(tmp_path: Path, ref: str) -> Path:
    """Two cells of one image (a baseline load format and the one compared with it), one per
    shard of two, the image's pull policy `always` as a nightly's."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    f = tmp_path / "matrix.yaml"
    f.write_text(yaml.safe_dump({
        "name": "pins", "launcher": "docker", "preflight": False, "repeats": 1,
        "models": [{"name": "m", "path": str(model)}],
        "load_formats": [{"name": "safetensors"}, {"name": "runai_streamer"}],
        "images": [{"name": "nightly", "ref": ref, "pull": "always"}],
        "reference_text": {"enabled": False},
        "server": {"boot_timeout_s": 60, "shutdown_timeout_s": 5},
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }))
    return f


def regbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def run_slice(config: Path, shard: str, results: Path, run_id: str, *images: str) -> Path:
    done = regbench("run", str(config), "--shard", shard, "--run-id", run_id, "--results", str(results),
                    *(a for pair in images for a in ("--image", pair)))
    # 1: the cell failed (its container exits at once); what matters is that it ran.
    assert done.returncode == 1, done.stdout + done.stderr
    return results / run_id


def test_slices_that_pulled_a_tag_before_and_after_it_moved_are_not_merged(engine, registry, builds, tmp_path):
    ref = f"{registry.host}/{REPO}:nightly"
    first = push(engine, builds[0], ref)
    untag(engine, ref)
    config = matrix(tmp_path, ref)
    a = run_slice(config, "1/2", tmp_path / "a", "pinsmix")
    second = push(engine, builds[1], ref)  # the nightly moved between the two jobs' starts
    b = run_slice(config, "2/2", tmp_path / "b", "pinsmix")
    assert [f.image_pin for f in ResultsDir(a).fingerprints()] == [first]
    assert [f.image_pin for f in ResultsDir(b).fingerprints()] == [second]

    done = regbench("merge", str(a), str(b), "-o", str(tmp_path / "merged"))
    said = " ".join((done.stdout + done.stderr).split())  # as one line, however the console wrapped it
    assert done.returncode == 2, said
    assert f"image nightly: the slices ran different builds of {ref}" in said, said
    assert f"{a} ran {first} (image {builds[0]})" in said and f"{b} ran {second} (image {builds[1]})" in said, said
    assert not (tmp_path / "merged" / "pinsmix").exists()


def test_slices_given_the_planned_pins_run_one_build_after_the_tag_moved(engine, registry, builds, tmp_path):
    ref = f"{registry.host}/{REPO}:nightly"
    first = push(engine, builds[0], ref)
    untag(engine, ref)
    config = matrix(tmp_path, ref)
    planned = regbench("plan", str(config), "--format", "pins")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert planned.stdout == f"nightly={first}\n"
    with pytest.raises(docker.errors.ImageNotFound):
        engine.images.get(ref)  # the registry was asked; nothing was pulled
    pins = planned.stdout.split()

    a = run_slice(config, "1/2", tmp_path / "a", "pinsone", *pins)
    push(engine, builds[1], ref)  # the tag moves; the slices were told the digest
    b = run_slice(config, "2/2", tmp_path / "b", "pinsone", *pins)
    done = regbench("merge", str(a), str(b), "-o", str(tmp_path / "merged"))
    assert done.returncode == 1, done.stdout + done.stderr  # merged: its cells failed to boot, as each slice said
    merged = ResultsDir(tmp_path / "merged" / "pinsone")
    assert {(f.image_pin, f.image_id) for f in merged.fingerprints()} == {(first, builds[0])}
    assert {r.server.image_id for r in merged.runs()} == {builds[0]}
    assert len(merged.runs()) == 2


def test_a_tag_the_registry_does_not_know_is_said_and_left_as_it_is(engine, registry, tmp_path):
    # An RC tag announced before it is pushed: every slice says its cells are not runnable, and
    # one such tag must not end the night's other images (the plan exits 0).
    ref = f"{registry.host}/{REPO}:never-pushed"
    planned = regbench("plan", str(matrix(tmp_path, ref)), "--format", "pins")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert planned.stdout.split() == [f"nightly={ref}"]
    assert f"{ref} not pinned: the registry has no such tag" in planned.stderr, planned.stderr


def test_a_registry_that_does_not_answer_prints_no_pin(engine, registry, tmp_path):
    ref = f"{registry.host}/{REPO}:nightly"
    registry.stop()
    planned = regbench("plan", str(matrix(tmp_path, ref)), "--format", "pins")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert planned.stdout == ""
    assert f"image {ref}: the registry did not resolve it" in planned.stderr, planned.stderr


@needs_canary  # the smoke matrix's model
def test_images_run_from_each_hosts_own_copy_are_printed_as_they_are_with_no_engine_asked(tmp_path):
    """configs/cpu-smoke-docker.yaml: images built on each host (`pull: never`), which no registry
    names; an engine that does not answer is not asked."""
    import os

    config = ROOT / "configs" / "cpu-smoke-docker.yaml"
    planned = subprocess.run([sys.executable, "-m", "bench", "plan", str(config), "--format", "pins"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock"))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    images = yaml.safe_load(config.read_text())["images"]
    assert planned.stdout.split() == [f"{i['name']}={i['ref']}" for i in images]
    assert planned.stderr.count("not pinned (pull: never") == len(images), planned.stderr
