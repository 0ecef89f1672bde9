"""Images resolved once per run, against a real registry on 127.0.0.1 and the real Docker engine.

Debian's docker-registry (installed by scripts/setup-docker.sh, not started there) serves on a
free loopback port from a temporary folder, one per test, stopped by the fixture; the engine
trusts loopback registries without TLS. The images are tiny builds made here (tini-static, which
the engine's own package brings, as `python3`: it exits at once), two builds under one tag, so
that no vLLM boots: a server "boots" its container, which exits, and the run records a boot
failure. What is checked is what the engine was asked to create, read back from its events.
"""

from __future__ import annotations

import io
import json
import platform
import secrets
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import requests
import yaml

from bench.core.matrix import expand
from bench.core.records import Fingerprint, RunRecord, TokenDiff
from bench.runner import pin_images, run_matrix
from bench.serve.images import ImageUnavailable, pin_of, repository
from bench.serve.launch_docker import LABEL, DockerLauncher
from bench.store.matrixfile import load_config
from bench.store.results import ResultsDir

from .support import ROOT, setup_missing, wait_until, write_checkpoint

REGISTRY = Path("/usr/bin/docker-registry")
TINI = Path("/usr/bin/tini-static")  # docker.io depends on tini: a static binary that exits at once
REPO = "regbench-test/tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Registry:
    """docker-registry serving from `root` on 127.0.0.1:<free port>; start() waits until /v2/
    answers, stop() ends it."""

    def __init__(self, root: Path):
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.config = root / "config.yml"
        self.config.write_text(yaml.safe_dump({
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
            "http": {"addr": self.host},
        }))
        self.log = root / "registry.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([str(REGISTRY), "serve", str(self.config)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(self.answers, 30, f"the registry on {self.host}", poll=0.05, process=self.process)

    def answers(self) -> bool:
        try:
            return requests.get(f"http://{self.host}/v2/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    try:
        return docker.from_env(timeout=120)
    except docker.errors.DockerException as exc:
        setup_missing(f"no Docker engine answers (scripts/setup-docker.sh): {exc}")
        raise


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    if not REGISTRY.exists():
        setup_missing("docker-registry is not installed (scripts/setup-docker.sh)")
    r = Registry(tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def builds(engine: docker.DockerClient) -> Iterator[list[str]]:
    """Two builds of one tiny image (their labels differ): their image ids. A label of this session's
    own makes them images of its own too, which no other test session uses or removes."""
    ids = []
    session = secrets.token_hex(8)
    for n in (1, 2):
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            dockerfile = (f"FROM scratch\nCOPY python3 /usr/bin/python3\nENV PATH=/usr/bin\n"
                          f"LABEL org.regbench.test.build={n} org.regbench.test.session={session}\n").encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile)
            tar.addfile(info, io.BytesIO(dockerfile))
            tar.add(TINI, arcname="python3")
        context.seek(0)
        image, _ = engine.images.build(fileobj=context, custom_context=True, rm=True, forcerm=True)
        ids.append(str(image.id))
    try:
        yield ids
    finally:
        for image_id in ids:
            try:
                engine.images.remove(image_id, force=True)
            except docker.errors.NotFound:
                pass


def push(engine: docker.DockerClient, image_id: str, ref: str) -> str:
    """Tags the build as `ref` and pushes it; returns its digest there (repo@sha256:...)."""
    repo, tag = ref.rsplit(":", 1)
    engine.images.get(image_id).tag(repo, tag)
    for line in engine.images.push(repo, tag=tag, stream=True, decode=True):
        assert "error" not in line, line
    digests = engine.images.get(image_id).attrs["RepoDigests"]
    return next(d for d in digests if d.startswith(repo + "@"))


def untag(engine: docker.DockerClient, ref: str) -> None:
    """Forgets `ref` and every digest reference of its repository here, keeping the builds."""
    repo = ref.rsplit(":", 1)[0]
    for image in engine.images.list(name=repo):
        for name in (*image.tags, *(image.attrs.get("RepoDigests") or [])):
            if name.startswith(repo):
                try:
                    engine.images.remove(name, noprune=True)
                except docker.errors.ImageNotFound:
                    pass  # a digest reference goes with the repository's last tag


def config_file(tmp_path: Path, ref: str, pull: str, repeats: int, audit: bool = False) -> Path:
    """A one-cell matrix of `ref`; with `audit`, a streamed load format and a checkpoint, so that
    the pre-flight audits it in a container of the image (which exits: the audit is skipped)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    if audit:
        write_checkpoint(model, [2])
    f = tmp_path / "matrix.yaml"
    f.write_text(yaml.safe_dump({
        "name": "registry", "launcher": "docker", "preflight": audit, "repeats": repeats,
        "models": [{"name": "m", "path": str(model)}],
        "load_formats": [{"name": "runai_streamer" if audit else "safetensors"}],
        "images": [{"name": "nightly", "ref": ref, "pull": pull}],
        "reference_text": {"enabled": False},
        "server": {"boot_timeout_s": 60, "shutdown_timeout_s": 5},
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }))
    return f


def created_from(engine: docker.DockerClient, run_id: str, since: float) -> dict[str, str]:
    """Container name -> the image reference the engine was asked to create it from, for every
    container of the run (read from the engine's events: the containers themselves are gone)."""
    events = engine.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                           filters={"type": "container", "event": "create", "label": f"{LABEL}.run={run_id}"})
    return {e["Actor"]["Attributes"]["name"]: e["Actor"]["Attributes"]["image"] for e in events}


class MoveTag:
    """Progress that pushes another build under the tag once the first run is done: mid-run."""

    def __init__(self, move):
        self.move, self.moved = move, False

    def start(self, total_runs: int) -> None: ...
    def status(self, text: str) -> None: ...

    def run_done(self, record: RunRecord, findings: list, divergence: list[TokenDiff] | None) -> None:
        if not self.moved:
            self.moved = True
            self.move()


def test_a_tag_moved_mid_run_changes_nothing_every_repeat_runs_the_first_digest(engine, registry, builds, tmp_path):
    ref = f"{registry.host}/{REPO}:nightly"
    first = push(engine, builds[0], ref)
    untag(engine, ref)  # the run must pull it
    config = load_config(config_file(tmp_path, ref, "always", repeats=3, audit=True))
    cells = expand(config)
    results = ResultsDir.create(tmp_path / "results", "regpin", config)
    launcher = DockerLauncher(config, "regpin")
    second: list[str] = []
    t0 = time.time()
    summary = run_matrix(config, cells, results, launcher=launcher,
                         progress=MoveTag(lambda: second.append(push(engine, builds[1], ref)))).summary

    assert second and second[0] != first  # the registry's tag did move, and so did the local one
    assert engine.images.get(ref).id == builds[1]
    runs = results.runs()
    assert [r.repeat for r in runs] == [1, 2, 3]
    assert {r.server.image_id for r in runs} == {builds[0]}, [r.server for r in runs]
    made = created_from(engine, "regpin", t0)
    assert sorted(n for n in made if n.endswith(("-1", "-2", "-3"))) == [
        f"regbench-regpin-{cells[0].id}-{i}" for i in (1, 2, 3)]
    audits = [n for n in made if n.startswith("regbench-regpin-audit-")]
    assert audits and len(made) == 4 + len(audits), made
    # The fingerprint's and every repeat's container from the digest; the audit's from the image
    # id it looked the pin up as (bench.weights.audit_docker): the same build.
    assert {made[n] for n in made if n not in audits} == {first}, made
    assert {made[n] for n in audits} == {builds[0]}, made
    [fp] = results.fingerprints()
    assert (fp.image_ref, fp.image_digest, fp.image_pin, fp.image_id) == (ref, first, first, builds[0])
    # Not a drift: one build ran (the judge would call differing image ids fingerprint_changed).
    assert "fingerprint_changed" not in summary.cells[0].reasons
    md = (results.path / "summary.md").read_text()
    assert f"| nightly | `{ref}` → `{first}` |" in md
    assert first in (results.path / "report.html").read_text()
    assert engine.containers.list(all=True, filters={"label": f"{LABEL}.run=regpin"}) == []


def test_a_resumed_run_keeps_the_pin_its_fingerprint_recorded(engine, registry, builds, tmp_path):
    ref = f"{registry.host}/{REPO}:nightly"
    first = push(engine, builds[0], ref)
    config = load_config(config_file(tmp_path, ref, "always", repeats=1))
    cells = expand(config)
    results = ResultsDir.create(tmp_path / "results", "regresume", config)
    results.add_fingerprint(Fingerprint(image="nightly", image_ref=ref, image_pin=first, image_digest=first))
    push(engine, builds[1], ref)  # the tag moved while the run was down
    untag(engine, ref)  # and the pinned build is gone from this host: pulled back by digest
    pinned = pin_images(cells, results, DockerLauncher(config, "regresume"), lambda _: None)
    assert (pinned[0].image.ref, pinned[0].image.pull) == (first, "never")
    assert engine.images.get(first).id == builds[0]


def test_a_registry_that_does_not_answer_is_one_error_before_any_cell(engine, registry, builds, tmp_path):
    ref = f"{registry.host}/{REPO}:gone"
    push(engine, builds[0], ref)
    untag(engine, ref)
    registry.stop()
    cfg = config_file(tmp_path, ref, "if-missing", repeats=3)
    out = subprocess.run([sys.executable, "-m", "bench", "run", str(cfg), "--results", str(tmp_path / "results"),
                          "--run-id", "reggone"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    said = out.stdout + out.stderr
    assert said.count(f"image {ref}: pull failed") == 1, said
    assert "connection refused" in said and "before any cell" in said, said
    run_dir = tmp_path / "results" / "reggone"
    assert not ResultsDir(run_dir).runs()
    assert engine.containers.list(all=True, filters={"label": f"{LABEL}.run=reggone"}) == []


def two_image_matrix(tmp_path: Path, refs: dict[str, str]) -> Path:
    """One model and load format, one cell per image of `refs` (name -> ref, pulled if missing)."""
    f = config_file(tmp_path, "unused", "if-missing", repeats=2)
    data = yaml.safe_load(f.read_text())
    data["images"] = [{"name": name, "ref": ref, "pull": "if-missing"} for name, ref in refs.items()]
    f.write_text(yaml.safe_dump(data))
    return f


def run_cells(tmp_path: Path, config: Path, run_id: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = subprocess.run([sys.executable, "-m", "bench", "run", str(config), "--results", str(tmp_path / "results"),
                          "--run-id", run_id], cwd=ROOT, capture_output=True, text=True, timeout=300)
    summary = tmp_path / "results" / run_id / "summary.json"
    cells = {c["image"]: c for c in json.loads(summary.read_text())["cells"]} if summary.exists() else {}
    return out, cells


def test_a_tag_not_published_is_not_runnable_and_the_other_images_still_run(engine, registry, builds, tmp_path):
    """An RC tag announced before it is pushed: the registry's 404, through the real engine, makes
    that image's cells not runnable in the registry's words; the other image's cells run (here its
    tiny container exits at once: boot_failed, as every test of this file expects)."""
    good, absent = f"{registry.host}/{REPO}:v1", f"{registry.host}/{REPO}:v2rc1"
    push(engine, builds[0], good)
    untag(engine, good)
    out, cells = run_cells(tmp_path, two_image_matrix(tmp_path, {"good": good, "rc": absent}), "regrc")
    said = out.stdout + out.stderr
    assert out.returncode == 1, said  # the good image's boot failures, nothing else
    assert "before any cell" not in said
    assert (cells["rc"]["verdict"], cells["rc"]["runs"], cells["rc"]["reasons"]) == (
        "not runnable", 0, {"not_runnable": 1}), cells["rc"]
    assert cells["good"]["verdict"] == "fail" and "boot_failed" in cells["good"]["reasons"], cells["good"]
    runs = ResultsDir(tmp_path / "results" / "regrc").runs()
    [rc_run] = [r for r in runs if r.cell_id == cells["rc"]["cell_id"]]  # said once, no second repeat
    assert rc_run.server.start_error is not None
    assert rc_run.server.start_error.startswith(f"not runnable on this host: image {absent} is not published")
    assert "manifest unknown" in rc_run.server.start_error  # the registry's own words
    assert len([r for r in runs if r.cell_id == cells["good"]["cell_id"]]) == 2


def index_without(registry: Registry, engine: docker.DockerClient, image_id: str, arch: str) -> str:
    """A real image index in the registry whose only entry is for `arch` (not this host's): the
    build is pushed, then an index (Docker's manifest list media type, as multi-arch tags are
    published) naming its manifest for that platform is put under its own tag."""
    source = f"{registry.host}/{REPO}:src"
    push(engine, image_id, source)
    v2, listed = ("application/vnd.docker.distribution.manifest.v2+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json")
    got = requests.get(f"http://{registry.host}/v2/{REPO}/manifests/src", headers={"Accept": v2}, timeout=30)
    got.raise_for_status()
    index = {"schemaVersion": 2, "mediaType": listed, "manifests": [
        {"mediaType": v2, "size": len(got.content), "digest": got.headers["Docker-Content-Digest"],
         "platform": {"architecture": arch, "os": "linux"}}]}
    put = requests.put(f"http://{registry.host}/v2/{REPO}/manifests/{arch}-only", data=json.dumps(index),
                       headers={"Content-Type": listed}, timeout=30)
    assert put.status_code == 201, put.text
    untag(engine, source)
    return f"{registry.host}/{REPO}:{arch}-only"


def test_an_index_without_this_hosts_platform_is_not_runnable_named(engine, registry, builds, tmp_path):
    """The Spark/Thor case (arm64 hosts, a tag published for amd64 only), here the other way
    round: the engine's own refusal of the index, and nothing else runnable: exit 2."""
    other = "arm64" if platform.machine() in ("x86_64", "amd64") else "amd64"
    ref = index_without(registry, engine, builds[0], other)
    out, cells = run_cells(tmp_path, two_image_matrix(tmp_path, {"other": ref}), "regarch")
    said = out.stdout + out.stderr
    assert out.returncode == 2, said
    assert "other" in cells, said
    assert (cells["other"]["verdict"], cells["other"]["runs"]) == ("not runnable", 0), cells["other"]
    [run] = ResultsDir(tmp_path / "results" / "regarch").runs()
    assert run.server.start_error is not None and "has no build for this host's platform (linux/" in run.server.start_error
    assert "no matching manifest" in run.server.start_error
    assert "NO CELL RUNNABLE ON THIS HOST" in (tmp_path / "results" / "regarch" / "summary.md").read_text()
    assert engine.containers.list(all=True, filters={"label": f"{LABEL}.run=regarch"}) == []


def test_an_absent_image_under_pull_never_is_said_before_any_cell(engine, tmp_path):
    config = load_config(config_file(tmp_path, f"{REPO}:absent", "never", repeats=1))
    with pytest.raises(ImageUnavailable, match=rf"image {REPO}:absent is not present here and its pull policy is 'never'"):
        DockerLauncher(config, "regnever").resolve_images(config.images)


@pytest.mark.parametrize(("ref", "repo"), [
    ("vllm/vllm-openai:v0.18.2", "vllm/vllm-openai"),
    ("docker.io/vllm/vllm-openai:v0.18.2", "vllm/vllm-openai"),
    ("docker.io/library/debian:12", "debian"),
    ("127.0.0.1:5000/a/b:nightly", "127.0.0.1:5000/a/b"),
    ("127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b"),
    ("nvcr.io/nvidia/vllm@sha256:" + "a" * 64, "nvcr.io/nvidia/vllm"),
])
def test_repository_of_a_ref(ref, repo):
    assert repository(ref) == repo


class FakeImage:
    def __init__(self, digests: list[str]):
        self.id = "sha256:" + "1" * 64
        self.attrs = {"RepoDigests": digests}


def test_the_pin_is_the_digest_of_the_asked_repository_else_the_image_id():
    mine, other = "vllm/vllm-openai@sha256:" + "a" * 64, "registry.invalid/vllm@sha256:" + "b" * 64
    assert pin_of(FakeImage([other, mine]), "docker.io/vllm/vllm-openai:nightly") == (mine, mine)
    assert pin_of(FakeImage([other]), "vllm/vllm-openai:nightly") == ("sha256:" + "1" * 64, other)
    assert pin_of(FakeImage([]), "regbench/vllm-cpu:0.32.0") == ("sha256:" + "1" * 64, None)


def test_the_workflow_logs_in_to_the_registry_with_credentials_by_name_before_the_slice():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "qualify.yml").read_text())
    run = flow["jobs"]["run"]
    names = [step.get("name", "") for step in run["steps"]]
    login = run["steps"][names.index("Log in to the image registry")]
    assert names.index("Log in to the image registry") < names.index("Run the slice")
    assert run["env"]["REGISTRY_USERNAME"] == "${{ secrets.REGISTRY_USERNAME }}"
    assert login["env"] == {"REGISTRY_PASSWORD": "${{ secrets.REGISTRY_PASSWORD }}"}
    assert "--password-stdin" in login["run"] and "$REGISTRY_PASSWORD" in login["run"].split("|")[0]
    logout = run["steps"][names.index("Log out of the image registry")]
    assert logout["if"].startswith("always()") and "docker logout" in logout["run"]
