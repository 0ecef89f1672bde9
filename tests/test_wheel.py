"""The built wheel, installed in a fresh venv outside the repository, is the whole product:
its platform profiles ship as package data and `regbench plan` resolves `platforms: [h200]`;
report.html's templates, stylesheet and script ship too, and a page renders from them; the
known-issue signatures ship too, and `regbench diagnose` names runai-model-streamer #157 in a
results folder holding the server log recorded from a real run of the seed bug."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import yaml

from . import synth
from .support import ROOT


def test_the_wheel_installed_outside_the_repo_plans_an_h200_matrix(tmp_path):
    # Built from a copy: setuptools writes build/ into the tree it builds.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv*", ".cache", ".git", "results", "build", "*.egg-info"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
                   check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = wheels.glob("regbench-*.whl")
    report_files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bench" / "report").rglob("*")
                    if p.name.endswith((".j2", ".css", ".js"))}
    assert report_files and report_files <= set(zipfile.ZipFile(wheel).namelist())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([venv / "bin" / "pip", "install", "-q", str(wheel)], check=True, capture_output=True,
                   text=True, timeout=600)
    matrix = tmp_path / "elsewhere" / "h200.yaml"  # no platforms/ folder beside it
    matrix.parent.mkdir()
    matrix.write_text(yaml.safe_dump({
        "name": "h200-plan", "launcher": "docker", "platforms": ["h200"],
        "models": [{"name": "m", "path": "org/model", "tensor_parallel_size": 2}],
        "load_formats": [{"name": "safetensors"}], "images": [{"name": "v1", "ref": "vllm/vllm-openai:v1"}],
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }))
    out = subprocess.run([venv / "bin" / "regbench", "plan", str(matrix)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "m__safetensors__h200__v1" in out.stdout and "[2 devices]" in out.stdout
    assert "platform h200: cells side by side on gpu devices" in out.stdout

    signatures = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bench" / "signatures").glob("*.yaml")}
    assert signatures and signatures <= set(zipfile.ZipFile(wheel).namelist())
    # The seed bug's cell with the server log of a real run of it (tests/data/logs/).
    seed = synth.streamer_bug(tmp_path / "results", "seed", repeats=1)
    log = (ROOT / "tests" / "data" / "logs" / "vllm-0.32-runai-0.16.0-stream-stop.log").read_text()
    run_dir = seed.path / "cells" / "m__runai_streamer__cpu__img" / "run-1"
    (run_dir / "server.log").write_text(log)
    diagnosed = subprocess.run([venv / "bin" / "regbench", "diagnose", str(seed.path)], capture_output=True,
                               text=True, cwd=tmp_path, timeout=120)
    assert diagnosed.returncode == 1, diagnosed.stdout + diagnosed.stderr  # a failing cell
    assert "runai-empty-shard-stream-stop" in diagnosed.stdout and "#157" in diagnosed.stdout, diagnosed.stdout

    page = subprocess.run([venv / "bin" / "python", "-c", RENDER], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert page.returncode == 0, page.stderr
    css, js = ((ROOT / "bench" / "report" / name).read_text() for name in ("report.css", "report.js"))
    assert 'id="heatmap"' in page.stdout and css in page.stdout and js in page.stdout


RENDER = """
from bench.core.records import Summary
from bench.report.html import html_report
from bench.report.model import Report
print(html_report(Report.of(Summary(run_id="r", config_name="t", started_at=0, finished_at=1, interrupted=False,
                                    cells=[], exit_code=0), [], [], [], [])))
"""
