"""vLLM's collect_env, which vLLM's bug-report form asks for, run in a cell's environment: here,
from the image's Python with its overlay and variables (run_collect_env_local); in a container of
the image, bench.bugreport.collect_env_docker. For `regbench report-bug` (bench.bugreport.gather)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Mapping

from bench.core.matrix import Cell
from bench.serve.launch import image_env

# A variable whose name looks like this is passed by name, never written out. Broader than
# bench.core.redact.SECRET_NAME on purpose: an issue goes to a public tracker, so a variable merely
# named *KEY* is masked too.
SECRET_LOOKING = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
COLLECT_ENV = ["-m", "vllm.collect_env"]
# It takes ~5 s on a CPU host; on a GPU host it also asks nvidia-smi and the driver, which can hang.
COLLECT_ENV_TIMEOUT_S = 180.0


class CollectEnvError(Exception):
    """Why collect_env could not be run here: one line, said in the report and on stderr."""


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f": {lines[-1]}" if lines else ""


def run_collect_env_local(cell: Cell, env: Mapping[str, str], timeout_s: float = COLLECT_ENV_TIMEOUT_S) -> str:
    """collect_env's output from the image's Python, with its overlay and variables on top of
    `env`. Raises CollectEnvError."""
    argv = [cell.image.python, *COLLECT_ENV]
    # Not from the caller's folder: `-m` puts it first on sys.path, and from a vLLM checkout it
    # would report that source tree instead of the image's vLLM.
    with tempfile.TemporaryDirectory(prefix="regbench-collect-env-") as cwd:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=image_env(cell.image, dict(env)), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise CollectEnvError(f"cannot run {cell.image.python}: {exc.strerror or exc}") from None
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise CollectEnvError(f"{shlex.join(argv)} timed out after {timeout_s:g} s") from None
        finally:
            if proc.poll() is None:  # timed out, or Ctrl-C: its children (lscpu, pip, ...) too
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise CollectEnvError(f"{shlex.join(argv)} exited with code {proc.returncode}"
                              + last_line(err.decode("utf-8", "replace")))
    return text
