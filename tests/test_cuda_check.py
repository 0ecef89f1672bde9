"""An image's NVIDIA_REQUIRE_* read as NVIDIA's container toolkit reads it (OR between the
space-separated terms, AND between the comma-separated factors), against real requirement
strings: the official vllm/vllm-openai image's and NVIDIA's CUDA base image's
(tests/data/nvidia-require-cuda/, each file says where it came from). An image is not runnable
before any container only when its requirement fails whatever the toolkit alone knows (the GPU's
brand, the compatibility libraries); an LTS datacenter driver that runs a newer CUDA image
through forward compatibility is left to the toolkit, never refused here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.core.verdicts import NOT_RUNNABLE
from bench.serve.cuda_require import Driver, Truth, evaluate, requirements, unmet
from bench.serve.fingerprint import host_driver
from bench.serve.images import not_runnable, toolkit_refusal

STANDIN = Path(__file__).parent / "data" / "gpu-standin"
REAL = Path(__file__).parent / "data" / "nvidia-require-cuda"


def image(name: str) -> dict:
    env = [line for line in (REAL / name).read_text().splitlines() if line and not line.startswith("#")]
    return {"Architecture": "amd64", "Os": "linux", "Config": {"Env": env}}


VLLM = image("vllm-openai-v0.16.0-cu129.env")  # cuda>=12.9, or a 535/550/560/565/570 branch by brand
CUDA124 = image("cuda-12.4.1-base.env")  # cuda>=12.4, or a 470/525/535 branch by brand


@pytest.mark.parametrize(("attrs", "driver", "runnable"), [
    (VLLM, Driver("580.95.05", "13.0"), True),   # new enough for the image's CUDA
    (VLLM, Driver("575.57.08", "12.9"), True),
    (VLLM, Driver("570.86.10", "12.8"), True),   # R570 LTS: forward compatibility, by brand: the toolkit decides
    (VLLM, Driver("535.183.01", "12.2"), True),  # R535 LTS likewise
    (VLLM, Driver("545.23.08", "12.3"), False),  # no listed branch, CUDA too old: whatever the brand
    (VLLM, Driver("530.30.02", "12.1"), False),
    (CUDA124, Driver("470.256.02", "11.4"), True),
    (CUDA124, Driver("510.108.03", "11.6"), False),
    (CUDA124, Driver("550.54.15", "12.4"), True),
])
def test_the_official_images_requirements_on_drivers_of_each_branch(attrs, driver, runnable):
    why = not_runnable("vllm/vllm-openai:v0.16.0", attrs, machine="x86_64", driver=driver)
    assert (why is None) == runnable, why
    if not runnable:
        assert why is not None and why.startswith(NOT_RUNNABLE)
        assert f"driver {driver.version}" in why and "meets none" in why and "cuda>=" in why


def test_the_grammar_as_the_toolkit_parses_it():
    d = Driver("570.86.10", "12.8")
    assert evaluate("cuda>=12.8", d) is Truth.HOLDS
    assert evaluate("cuda>=12.9", d) is Truth.FAILS
    assert evaluate("cuda>=12.9 driver>=570", d) is Truth.HOLDS  # OR
    assert evaluate("cuda>=12.8,driver<570", d) is Truth.FAILS  # AND
    assert evaluate("cuda>=12.9 brand=tesla,driver>=570,driver<571", d) is Truth.UNKNOWN
    assert evaluate("cuda>=12.9 brand=tesla,driver>=535,driver<536", d) is Truth.FAILS
    assert evaluate("arch>=9.0", d) is Truth.UNKNOWN  # the compute capability: the toolkit's to read
    assert evaluate("driver!=570.86.10", d) is Truth.FAILS and evaluate("driver<=570.86.10", d) is Truth.HOLDS
    assert evaluate("cuda>12.8", d) is Truth.FAILS and evaluate("cuda=12.8", d) is Truth.HOLDS
    assert evaluate("frobs>=3", d) is Truth.HOLDS  # a property it does not know is skipped
    assert evaluate("cuda>=12.9  frobs>=3", d) is Truth.FAILS  # an empty or skipped term is dropped
    assert evaluate("cuda>=12.9", Driver("570.86.10", None)) is Truth.UNKNOWN  # nvidia-smi did not say


def test_what_the_toolkit_gathers_from_an_image():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_REQUIRE_DRIVER": "driver>=570", "CUDA_VERSION": "12.8.1",
           "NVIDIA_REQUIRE_JETPACK": "csv-mounts=all"}
    assert requirements(env) == {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_REQUIRE_DRIVER": "driver>=570"}
    assert requirements({"CUDA_VERSION": "13.0.1"}) == {"CUDA_VERSION": "cuda>=13.0"}  # a legacy image
    for waived in ("1", "true", "True", "t"):
        assert requirements({**env, "NVIDIA_DISABLE_REQUIRE": waived}) == {}
    assert requirements({**env, "NVIDIA_DISABLE_REQUIRE": "false"}) != {}
    # Every requirement must hold: one of two failing is enough.
    attrs = {"Config": {"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_DRIVER=driver>=575"]}}
    why = unmet(attrs, Driver("570.86.10", "12.8"))
    assert why is not None and "NVIDIA_REQUIRE_DRIVER" in why
    assert unmet({}, Driver("570.86.10", "12.8")) is None


def test_no_driver_to_ask_leaves_it_to_the_start():
    assert not_runnable("r", VLLM, machine="x86_64", driver=None) is None


def test_a_refusal_of_the_toolkit_is_not_runnable_in_its_own_words():
    # Real engine answers, as users reported them (NVIDIA/nvidia-container-toolkit#152 and
    # SyneRBI/PETRIC2#27 for a current engine; NVIDIA/nvidia-docker#1442 for Docker 19/20).
    current = ("failed to create task for container: failed to create shim task: OCI runtime create failed: runc "
               "create failed: unable to start container process: error during container init: error running "
               "prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
               "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8, please update your "
               "driver to a newer version, or use an earlier cuda container: unknown")
    older = ('OCI runtime create failed: container_linux.go:370: starting container process caused: '
             'process_linux.go:459: container init caused: Running hook #0:: error running hook: exit status 1, '
             'stdout: , stderr: nvidia-container-cli: requirement error: unsatisfied condition: cuda>=11.0, please '
             'update your driver to a newer version, or use an earlier cuda container: unknown')
    for said, cond in ((current, "cuda>=12.8"), (older, "cuda>=11.0")):
        why = toolkit_refusal("vllm/vllm-openai:v0.16.0", said)
        assert why is not None and why.startswith(NOT_RUNNABLE)
        assert why.endswith(f"nvidia-container-cli: requirement error: unsatisfied condition: {cond}, please update "
                            "your driver to a newer version, or use an earlier cuda container"), why
    # An engine without NVIDIA's runtime (moby's answer to a GPU request it cannot serve).
    why = toolkit_refusal("r", 'could not select device driver "" with capabilities: [[gpu]]')
    assert why is not None and why.startswith(NOT_RUNNABLE) and "container toolkit" in why
    assert toolkit_refusal("r", "exec: \"python3\": executable file not found in $PATH: unknown") is None


def test_the_driver_is_read_from_nvidia_smi(monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_CUDA", "12.8")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_DRIVER", "570.86.10")
    assert host_driver() == Driver("570.86.10", "12.8")
    monkeypatch.delenv("NVIDIA_SMI_STANDIN_CUDA")
    assert host_driver() == Driver("570.86.10", None)  # a driver that does not say
    monkeypatch.setenv("PATH", "/nonexistent")
    assert host_driver() is None  # no nvidia-smi: a host without NVIDIA's driver
