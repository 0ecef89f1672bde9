"""GPU sets, GPU memory and images of another architecture, on a real Docker engine that accepts
GPU requests without GPUs (tests/gpu_docker.py: a dockerd of the tests' own with the stand-in
NVIDIA hook on its PATH) and a stand-in nvidia-smi (tests/data/gpu-standin/nvidia-smi). No vLLM
boot: the containers run a tiny static program that prints its environment or waits.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.core.config import with_devices
from bench.core.judge import judge_server
from bench.core.matrix import expand
from bench.core.verdicts import Reason
from bench.serve.errors import BootError
from bench.serve.images import not_runnable
from bench.serve.launch_docker import Container, DockerLauncher, container_env, run_options
from bench.serve.slots import SlotPool
from bench.store.matrixfile import load_config

from .gpu_docker import IMAGE, StandinEngine, available
from .support import setup_missing

ROOT = Path(__file__).resolve().parent.parent
STANDIN_BIN = ROOT / "tests" / "data" / "gpu-standin"



# Module-scoped, so that it runs before the module-scoped engine below (pytest sets up the wider
# scope first): a machine without dockerd skips, instead of failing to start it.
@pytest.fixture(autouse=True, scope="module")
def _standin_engine_possible():
    why_not = available()
    if why_not is not None:
        setup_missing(f"stand-in GPU engine: {why_not}")


@pytest.fixture(scope="module")
def engine():
    e = StandinEngine()
    try:
        yield e.start()
    finally:
        e.stop()


def env_of(engine: StandinEngine, **create) -> dict[str, str]:
    # The profile's memlock/stack ulimits cannot be raised in this sandbox (runc: "error setting
    # rlimits ... operation not permitted"); GPU hosts allow them. Everything else is as created.
    create.pop("ulimits", None)
    out = engine.client.containers.run(IMAGE, remove=True, **create)
    return dict(line.split("=", 1) for line in out.decode().splitlines() if "=" in line)


def matrix(tmp_path: Path, platform: str, image_ref: str) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    data = {
        "name": "gpu", "launcher": "docker", "platforms": [platform],
        "models": [{"name": "m", "path": str(model)}],
        "load_formats": [{"name": "safetensors"}],
        "images": [{"name": "img", "ref": image_ref, "pull": "never"}],
        "baseline": "safetensors",
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_the_engine_registers_the_nvidia_driver_with_the_standin_hook(engine):
    # `gpus: all` (the profile's default without slots) reaches the container as "all" ...
    env = env_of(engine, **run_options(load_config(matrix(engine.dir, "h200", IMAGE)).profile("h200")))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # ... and the hook ran as the OCI prestart hook, with the container's spec in its bundle.
    specs = [json.loads(p.read_text()) for p in engine.records.glob("*.config.json")]
    assert any("NVIDIA_VISIBLE_DEVICES=all" in s["process"]["env"] for s in specs)


def test_two_slots_give_two_containers_disjoint_gpus(engine, tmp_path):
    profile = load_config(matrix(tmp_path, "h200", IMAGE)).profile("h200")
    pool = SlotPool("gpu", profile.devices, locks=tmp_path / "locks")
    a, b = pool.acquire(2), pool.acquire(2)
    seen = []
    for devices in (a, b):
        env = env_of(engine, **run_options(profile, devices))
        seen.append(set(env["NVIDIA_VISIBLE_DEVICES"].split(",")))
    assert seen == [set(a.ids), set(b.ids)] and not seen[0] & seen[1], seen
    assert "all" not in seen[0] | seen[1]
    pool.release(a)
    pool.release(b)


def test_under_the_nvidia_runtime_two_slots_give_disjoint_nvidia_visible_devices(engine, tmp_path):
    # Jetson (agx-thor): no device request; the runtime reads NVIDIA_VISIBLE_DEVICES from the
    # container's environment, which the launcher sets to the slot's ids.
    config = with_devices(load_config(matrix(tmp_path, "agx-thor", IMAGE)), "0-3")
    profile = config.profile("agx-thor")
    cell = expand(config)[0]
    pool = SlotPool("gpu", profile.devices, locks=tmp_path / "locks")
    seen = []
    for devices in (pool.acquire(2), pool.acquire(2)):
        create = run_options(profile, devices)
        assert create["runtime"] == "nvidia" and "device_requests" not in create
        env = env_of(engine, environment=container_env(cell, config, {}, devices), **create)
        seen.append(set(env["NVIDIA_VISIBLE_DEVICES"].split(",")))
    assert seen == [{"0", "1"}, {"2", "3"}]


def test_container_gpu_memory_comes_from_nvidia_smi_by_the_containers_pids(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}:{os.environ['PATH']}")
    c = Container(engine.client, IMAGE, ["pause"], dict(network_mode="none"), tmp_path / "server.log")
    try:
        pids = c.pids()
        assert pids, "the engine's top lists the container's process"
        apps = tmp_path / "apps.csv"
        # nvidia-smi's CSV: a process of another server first, then the container's, on two GPUs.
        apps.write_text("1, 5000\n" + "".join(f"{p}, 1024\n{p}, 512\n" for p in pids))
        monkeypatch.setenv("NVIDIA_SMI_STANDIN_APPS", str(apps))
        host, gpu = c.memory()
        assert host is not None and gpu == len(pids) * 1536 * 2**20
        # GB10 (unified memory): nvidia-smi lists the process with [N/A]; the container's memory counts.
        apps.write_text("".join(f"{p}, [N/A]\n" for p in pids))
        host, gpu = c.memory()
        assert host is not None and gpu == host
        # Processes nvidia-smi does not list: no GPU figure.
        apps.write_text("1, 5000\n")
        assert c.memory()[1] is None
    finally:
        c.cleanup()


def test_an_image_of_another_architecture_is_not_runnable_and_starts_no_container(engine, tmp_path, monkeypatch):
    arm = "regbench/gpu-standin:arm64"
    engine.image_for(arm, "arm64")
    assert engine.client.images.get(arm).attrs["Architecture"] == "arm64"
    config = load_config(matrix(tmp_path, "h200", arm))
    launcher = DockerLauncher(config, "archrun", docker_client=engine.client)
    cell = expand(config)[0]
    before = len(engine.client.containers.list(all=True))
    outcomes = []
    for repeat in (1, 2):
        server = launcher.server(cell, repeat, tmp_path)
        with pytest.raises(BootError, match="not runnable on this host"), server:
            pass
        outcomes.append(server.outcome)
    assert len(engine.client.containers.list(all=True)) == before  # none created
    for outcome in outcomes:
        [finding] = judge_server(outcome, "", "")
        assert finding.reason == Reason.NOT_RUNNABLE
        assert "linux/arm64" in finding.detail and "amd64" in finding.detail
    assert len(launcher._runnable) == 1  # inspected once
    # The fingerprint says it too, without a probe container.
    fp = launcher.fingerprint(config.images[0])
    assert fp.error is not None and fp.error.startswith("not runnable on this host")
    assert len(engine.client.containers.list(all=True)) == before


def test_arch_check_is_pure():
    assert not_runnable("r", {"Architecture": "amd64", "Os": "linux"}, "x86_64") is None
    assert not_runnable("r", {"Architecture": "arm64", "Os": "linux"}, "aarch64") is None
    reason = not_runnable("vllm/vllm-openai:v1", {"Architecture": "amd64", "Os": "linux"}, "aarch64")
    assert reason is not None and reason.startswith("not runnable on this host")
    assert "linux/amd64" in reason and "arm64 (aarch64)" in reason
    assert not_runnable("r", {}, "x86_64") is None  # nothing known: the start says


def test_docker_cli_sees_the_ids_given(engine):
    # What a user would type: `docker run --gpus device=1 IMAGE` shows NVIDIA_VISIBLE_DEVICES=1.
    out = subprocess.run(["docker", "-H", engine.url, "run", "--rm", "--gpus", "device=1", IMAGE],
                         capture_output=True, text=True, check=True).stdout
    assert "NVIDIA_VISIBLE_DEVICES=1" in out.splitlines()


# What libnvidia-container prints when an image's requirement fails on the host's driver, as users
# reported it from a current toolkit (NVIDIA/nvidia-container-toolkit#152, SyneRBI/PETRIC2#27).
TOOLKIT_REFUSAL = ("Auto-detected mode as 'legacy'\n"
                   "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.9, please update "
                   "your driver to a newer version, or use an earlier cuda container\n")
VLLM_ENV = ROOT / "tests" / "data" / "nvidia-require-cuda" / "vllm-openai-v0.16.0-cu129.env"


def test_the_toolkit_decides_what_only_it_can_and_its_refusal_is_not_runnable(engine, tmp_path, monkeypatch):
    """The official vLLM image's NVIDIA_REQUIRE_CUDA on an R570 LTS driver (CUDA 12.8): regbench
    cannot know the brand, so it starts the container; the toolkit's refusal (the stand-in hook
    saying the toolkit's words) is not_runnable in those words, and no container is left. On a
    driver no listed branch covers (545, CUDA 12.3) nothing is started at all."""
    env = [line for line in VLLM_ENV.read_text().splitlines() if line and not line.startswith("#")]
    ref = "regbench/gpu-standin:vllm-env"
    client = engine.client
    base = client.containers.create(IMAGE)
    try:  # quoted, as NVIDIA's Dockerfiles write it: unquoted, ENV would split it at its spaces
        base.commit(repository="regbench/gpu-standin", tag="vllm-env",
                    changes=[f"ENV {k}={json.dumps(v)}" for k, v in (e.split("=", 1) for e in env)])
    finally:
        base.remove(force=True)
    made = dict(e.split("=", 1) for e in client.images.get(ref).attrs["Config"]["Env"])
    assert made["NVIDIA_REQUIRE_CUDA"] == dict(e.split("=", 1) for e in env)["NVIDIA_REQUIRE_CUDA"]
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    config = load_config(matrix(tmp_path, "h200", ref))
    cell = expand(config)[0]
    before = {c.id for c in client.containers.list(all=True)}

    monkeypatch.setenv("NVIDIA_SMI_STANDIN_DRIVER", "545.23.08")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_CUDA", "12.3")
    old = DockerLauncher(config, "cudaold", docker_client=client)
    server = old.server(cell, 1, tmp_path)
    with pytest.raises(BootError, match="not runnable on this host"), server:
        pass
    [finding] = judge_server(server.outcome, "", "")
    assert finding.reason == Reason.NOT_RUNNABLE and "driver 545.23.08" in finding.detail
    assert {c.id for c in client.containers.list(all=True)} == before  # none created

    monkeypatch.setenv("NVIDIA_SMI_STANDIN_DRIVER", "570.86.10")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_CUDA", "12.8")
    lts = DockerLauncher(config, "cudalts", docker_client=client)
    assert lts.not_runnable(ref, ref) is None  # left to the toolkit
    (engine.dir / "refuse").write_text(TOOLKIT_REFUSAL)
    try:
        opts = run_options(cell.profile)
        opts.pop("ulimits", None)  # not raisable in this sandbox (env_of says why)
        with pytest.raises(Exception) as refused:
            Container(client, ref, ["serve"], dict(opts, labels={"org.regbench": "1"}), tmp_path / "lts.log")
    finally:
        (engine.dir / "refuse").unlink()
    why = str(refused.value)
    assert why.startswith("not runnable on this host: the NVIDIA container toolkit refused image"), why
    assert why.endswith("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.9, please update "
                        "your driver to a newer version, or use an earlier cuda container"), why
    assert {c.id for c in client.containers.list(all=True)} == before  # the refused one removed
