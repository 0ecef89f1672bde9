"""What `regbench run` prints at the end, on the fake vLLM (tests/data/fakevllm): the table, one
line per failing cell with its likely cause, signature id and the command that confirms it, and
the results path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from .support import ROOT

FAKEVLLM = Path(__file__).parent / "data" / "fakevllm"


def test_run_ends_with_the_likely_cause_of_each_failing_cell_and_how_to_confirm_it(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    matrix = {
        "name": "console",
        "models": [{"name": "m", "path": str(model)}],
        # The fake server answers 128 copies of one id with empty text under runai_streamer.
        "load_formats": [{"name": "safetensors"}, {"name": "runai_streamer", "env": {"FAKE_VLLM_MODE": "empty"}}],
        "images": [{"name": "fake", "python": sys.executable, "pythonpath": [str(FAKEVLLM)]}],
        "baseline": "safetensors",
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}], "request_timeout_s": 10},
        "server": {"boot_timeout_s": 60, "shutdown_timeout_s": 5},
        "reference_text": {"enabled": False},
        "preflight": False,
    }
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix))
    done = subprocess.run([sys.executable, "-m", "bench", "run", str(path), "--results", str(tmp_path / "r"),
                           "--run-id", "r"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    causes = [line for line in lines if line.startswith("m__")]
    assert causes == [
        f"m__runai_streamer__cpu__fake: likely cause: runai-model-streamer stops at an empty safetensors shard; the "
        f"tensors after it never reach vLLM [runai-empty-shard-stream-stop]; confirm: regbench audit {model} "
        f"--python {sys.executable} --pythonpath {FAKEVLLM}"], done.stdout
    # After the table, before the results path (the last line).
    assert lines[-1] == f"results: {tmp_path / 'r' / 'r'}" and lines.index(causes[0]) == len(lines) - 2
