"""An image whose CUDA the host's NVIDIA driver cannot run is said before any container, as
`not_runnable`, where the host has a driver to ask (nvidia-smi's "CUDA Version"; a stand-in here)
and the image says what it needs (NVIDIA_REQUIRE_CUDA, which NVIDIA's container toolkit enforces,
else CUDA_VERSION)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.core.verdicts import NOT_RUNNABLE
from bench.serve.fingerprint import host_cuda
from bench.serve.launch_docker import not_runnable, required_cuda

STANDIN = Path(__file__).parent / "data" / "gpu-standin"


def attrs(*env: str) -> dict:
    return {"Architecture": "amd64", "Os": "linux", "Config": {"Env": list(env)}}


def test_what_an_image_needs_of_the_driver():
    official = attrs("CUDA_VERSION=12.8.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=470,driver<471")
    assert required_cuda(official) == ((12, 8), "NVIDIA_REQUIRE_CUDA")
    assert required_cuda(attrs("CUDA_VERSION=13.0.0")) == ((13, 0), "CUDA_VERSION")
    assert required_cuda(attrs("NVIDIA_REQUIRE_CUDA=cuda>=12.8", "NVIDIA_DISABLE_REQUIRE=1")) is None
    assert required_cuda(attrs("PATH=/usr/bin")) is None and required_cuda({}) is None


def test_a_driver_too_old_for_the_image_is_not_runnable(monkeypatch):
    image = attrs("NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=470,driver<471")
    why = not_runnable("vllm/vllm-openai:v0.18.2", image, machine="x86_64", driver_cuda=(12, 4))
    assert why is not None and why.startswith(NOT_RUNNABLE)
    assert "needs CUDA 12.8 (NVIDIA_REQUIRE_CUDA)" in why and "runs CUDA 12.4 at most" in why
    assert not_runnable("r", image, machine="x86_64", driver_cuda=(12, 8)) is None
    assert not_runnable("r", image, machine="x86_64", driver_cuda=(13, 0)) is None
    assert not_runnable("r", image, machine="x86_64", driver_cuda=None) is None  # no driver: nothing to ask


def test_the_drivers_cuda_is_read_from_nvidia_smi(monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_CUDA", "12.4")
    assert host_cuda() == (12, 4)
    monkeypatch.delenv("NVIDIA_SMI_STANDIN_CUDA")
    assert host_cuda() is None  # a driver that does not say
    monkeypatch.setenv("PATH", "/nonexistent")
    assert host_cuda() is None  # no nvidia-smi: a host without NVIDIA's driver
