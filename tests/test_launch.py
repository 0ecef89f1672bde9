from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.config import parse_config
from bench.core.judge import judge_server
from bench.core.matrix import expand
from bench.serve.errors import BootError
from bench.serve.launch_local import ProcessGroup, vllm_argv, vllm_env
from bench.serve.lifecycle import Server
from bench.serve.ports import free_port
from bench.serve.reap import labelled_processes, reap_local

from .support import ROOT, processes_labelled, wait_until

FAKE = str(Path(__file__).parent / "fakeproc.py")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def server(argv: list[str], tmp_path: Path, port: int, boot: float = 10, shutdown: float = 5) -> Server:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    log = run_dir / "server.log"
    scratch = tmp_path / "scratch"
    # Labelled as the bench labels its servers: every process of this one (children that leave its
    # group too) is found and counted by that label.
    env = {**os.environ, "REGBENCH_RUN_DIR": str(run_dir)}
    return Server(lambda: ProcessGroup(argv, env, run_dir, log, scratch), argv, port, log, boot, shutdown)


def proc(tmp_path: Path, mode: str, boot: float = 10, shutdown: float = 5) -> Server:
    port = free_port()
    return server([sys.executable, FAKE, str(port), mode], tmp_path, port, boot, shutdown)


def log_of(p: Server) -> str:
    return p.log_path.read_text()


def test_healthy_then_stopped_cleanly(tmp_path):
    p = proc(tmp_path, "ok")
    with p:
        assert p.outcome.boot_s is not None
        pid = p.handle.proc.pid
        assert alive(pid)
    assert not alive(pid)
    assert p.outcome.exit_code == -15 and not p.outcome.killed  # our fake dies of SIGTERM
    assert "fakeproc ok" in log_of(p)
    assert not (tmp_path / "scratch").exists()


def verdict(p: Server) -> str:
    return ", ".join(sorted({f.reason for f in judge_server(p.outcome, "", log_of(p))}))


def processes_left(p: Server) -> int:
    """Live (not zombie) processes of the server, its children included: those carrying its label."""
    return len(processes_labelled(p.log_path.parent))


@pytest.mark.fault("server exits during boot")
def test_exit_during_boot_is_reported_with_its_code(tmp_path, fault):
    p = proc(tmp_path, "exit-during-boot")
    with pytest.raises(BootError):
        p.__enter__()
    left = processes_left(p)
    fault(verdict(p), processes_left=left)
    assert p.outcome.exited_early_code == 3 and p.outcome.boot_s is None
    assert "model path missing" in log_of(p)
    assert verdict(p) == "boot_failed" and left == 0


@pytest.mark.fault("boot never becomes healthy")
def test_boot_deadline_kills_the_server(tmp_path, fault):
    p = proc(tmp_path, "never-healthy", boot=1.5)
    with pytest.raises(BootError, match=r"not healthy after 1\.5 s"):
        p.__enter__()
    left = processes_left(p)
    fault(verdict(p), processes_left=left)
    assert not alive(p.handle.proc.pid)
    assert verdict(p) == "boot_timeout" and left == 0


@pytest.mark.fault("server ignores SIGTERM")
def test_sigterm_ignored_means_sigkill_after_grace(tmp_path, fault):
    p = proc(tmp_path, "ignore-term", shutdown=1)
    with p:
        pid = p.handle.proc.pid
    left = processes_left(p)
    fault(verdict(p), processes_left=left)
    assert p.outcome.killed and p.outcome.exit_code == -9
    assert not alive(pid)
    assert verdict(p) == "exit_code" and left == 0


@pytest.mark.fault("server leaves children running")
def test_children_of_the_server_are_reaped_too(tmp_path, fault):
    p = proc(tmp_path, "children")
    with p:
        log = log_of(p)
        child = int(re.search(r"child pid=(\d+)", log).group(1))
        assert alive(child)
        assert processes_left(p) >= 2  # the count sees the server and its child
    left = processes_left(p)
    fault("children killed with the server's group", processes_left=left)
    assert not alive(child) and left == 0


def test_an_exception_in_the_with_block_still_stops_the_server(tmp_path):
    p = proc(tmp_path, "ok")
    with pytest.raises(KeyboardInterrupt), p:
        pid = p.handle.proc.pid
        raise KeyboardInterrupt
    assert not alive(pid)


def test_shutdown_phase_offset_marks_what_was_printed_after_stop(tmp_path):
    p = proc(tmp_path, "noisy-exit")
    with p:
        pass
    log = p.log_path.read_bytes()
    after = log[p.outcome.stop_requested_at_byte :].decode()
    assert "UnicodeDecodeError" in after and "fakeproc" not in after


def test_vllm_command_and_environment(minimal):
    minimal["images"][0].update(pythonpath=["/overlay/0.16.0"], env={"A": "1"})
    minimal["load_formats"][1].update(model_loader_extra_config={"concurrency": 4}, env={"B": "2"})
    minimal["server"] = {"args": ["--dtype", "float32"], "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    config = parse_config(minimal)
    cell = expand(config)[1]
    argv = vllm_argv(cell, config.server, 8000)
    assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", "/models/m"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--load-format") + 1] == "runai_streamer"
    assert argv[argv.index("--model-loader-extra-config") + 1] == '{"concurrency": 4}'
    env = vllm_env(cell, config.server, Path("/s"), {"PYTHONPATH": "/mine", "HOME": "/root"})
    assert env["PYTHONPATH"] == "/overlay/0.16.0:/mine"  # the overlay wins
    assert env["TMPDIR"] == "/s/tmp" and env["VLLM_CACHE_ROOT"] == "/s/cache"
    assert (env["A"], env["B"], env["VLLM_CPU_KVCACHE_SPACE"], env["HF_HUB_OFFLINE"]) == ("1", "2", "1", "1")
    assert env["VLLM_NO_USAGE_STATS"] == "1"  # no usage report from any fresh start


@pytest.mark.fault("server command cannot start")
def test_a_command_that_cannot_start_is_a_boot_failure(tmp_path, fault):
    p = server([str(tmp_path / "no-python"), "-m", "vllm"], tmp_path, free_port())
    with pytest.raises(BootError, match="cannot start"):
        p.__enter__()
    left = processes_left(p)
    findings = judge_server(p.outcome, "", "")
    fault(", ".join(f.reason for f in findings), processes_left=left)
    assert p.outcome.start_error and not (tmp_path / "scratch").exists()
    assert [f.reason for f in findings] == ["boot_failed"] and left == 0


def test_container_options_of_a_platform_and_secrets_by_name(minimal):
    from bench.core.config import Platform
    from bench.serve.launch_docker import container_env, labels, run_options

    minimal["launcher"] = "docker"
    minimal["images"][0].update(ref="vllm/vllm-openai:v0.18.1", pythonpath=["/overlay"])
    minimal["server"] = {"env_passthrough": ["HF_TOKEN", "NOT_SET"]}
    config = parse_config(minimal)
    cell = expand(config)[0]
    env = container_env(cell, config, {"HF_TOKEN": "hf_secret", "OTHER": "x"})
    assert env["HF_TOKEN"] == "hf_secret" and "OTHER" not in env and "NOT_SET" not in env
    assert env["PYTHONPATH"] == "/opt/regbench/overlay/0" and env["VLLM_HOST_IP"] == "127.0.0.1"
    spark = Platform.model_validate({"name": "spark", "docker": {"gpus": "all", "ipc_host": True, "shm_size": "16g",
                                     "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}]}})
    opts = run_options(spark)
    assert opts["network_mode"] == "host" and opts["ipc_mode"] == "host" and opts["shm_size"] == "16g"
    assert opts["device_requests"][0]["Count"] == -1 and opts["ulimits"][0]["Name"] == "memlock"
    thor = run_options(Platform.model_validate({"name": "thor", "docker": {"runtime": "nvidia"}}))
    assert thor["runtime"] == "nvidia" and "device_requests" not in thor
    from bench.serve.reap import owner_tag

    assert labels("r1", cell.id, 2) == {"org.regbench": "1", "org.regbench.run": "r1", "org.regbench.cell": cell.id,
                                         "org.regbench.repeat": "2", "org.regbench.owner": owner_tag()}


def test_docker_launcher_needs_image_refs(minimal):
    from bench.core.config import ConfigError

    minimal["launcher"] = "docker"
    with pytest.raises(ConfigError, match="docker launcher needs `ref` on images"):
        parse_config(minimal)


def test_clean_passes_over_containers_that_go_while_it_works():
    # The docker SDK's own listing and removal, with the engine's replies of a bench that removes its
    # containers as clean runs: one gone before its inspection, one before its removal.
    import docker
    import requests

    from bench.serve.launch_docker import clean

    def gone(what: str) -> docker.errors.NotFound:
        return docker.errors.NotFound(f"No such container: {what}", response=requests.Response())

    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")  # no engine asked
    removed = []

    def inspect(cid):
        if cid == "a":
            raise gone(cid)
        return {"Id": cid, "Name": f"/regbench-{cid}"}

    def remove(cid, **_):
        if cid == "b":
            raise gone(cid)
        removed.append(cid)

    client.api.containers = lambda **_: [{"Id": "a"}, {"Id": "b"}, {"Id": "c"}]
    client.api.inspect_container = inspect
    client.api.remove_container = remove
    assert clean(client, "r1") == (["container regbench-c"], []) and removed == ["c"]


def test_a_server_gone_before_the_stop_is_a_death_while_serving(tmp_path):
    p = proc(tmp_path, "ok")
    with p:
        os.killpg(p.handle.proc.pid, 9)  # killed from outside, after it became healthy
    assert p.outcome.exited_early_code == -9 and p.outcome.exit_code == -9 and not p.outcome.killed


def test_leftovers_are_found_by_their_own_results_folder(tmp_path):
    # Two runs with the same id in different folders: resuming one must not touch the other.
    procs = {}
    for side in ("a", "b"):
        env = {**os.environ, "REGBENCH_RUN_DIR": str(tmp_path / side / "r" / "cells" / "c" / "run-1")}
        procs[side] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                                       start_new_session=True)  # reaping kills the whole group
    try:
        # Until each has exec'd: a process just forked still shows its parent's environment.
        wait_until(lambda: {procs["a"].pid, procs["b"].pid} <= set(labelled_processes("r")), 30, "both labelled")
        assert labelled_processes(run_dir=tmp_path / "a" / "r") == [procs["a"].pid]
        assert reap_local(run_dir=tmp_path / "b" / "r").removed == [f"local server process {procs['b'].pid}"]
        procs["b"].wait(10)
        assert procs["a"].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_the_docker_sdk_is_imported_only_for_the_docker_launcher():
    code = ("import sys, bench.cli, bench.runner\n"
            "from bench.serve.launchers import backend\n"
            "backend('local')\n"
            "print('docker' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_no_launcher_name_is_switched_on_outside_the_launcher_modules():
    # Every back-end difference lives behind bench.serve.launchers; the rest of the bench asks it.
    import re

    switch = re.compile(r"""launcher\s*[!=]=\s*["']|["'](local|docker)["']\s*[!=]=\s*\S*launcher""")
    allowed = {"launchers.py", "launch_local.py", "launch_docker.py"}
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "bench").rglob("*.py") if p.name not in allowed
                 for i, line in enumerate(p.read_text().splitlines(), 1) if switch.search(line)]
    assert offenders == []


def test_each_backend_registers_once_and_the_schema_knows_it_and_what_it_needs():
    # The schema (bench.core) cannot import the launcher layer: it keeps its own list of names and
    # of the image fields each back-end cannot run without, which must be the registry's.
    from typing import get_args

    from bench.core.config import IMAGE_FIELDS_NEEDED, Image, LauncherName
    from bench.serve.launchers import BACKENDS, backend, needs
    from bench.weights import readers

    assert BACKENDS.names() == ["local", "docker"] and set(get_args(LauncherName)) == set(BACKENDS.names())
    unset_by_default = {f for f, info in Image.model_fields.items() if info.default is None}
    assert {n: tuple(f for f in needs(n) if f in unset_by_default) for n in BACKENDS.names()} == IMAGE_FIELDS_NEEDED
    for name in BACKENDS.names():
        assert set(needs(name)) <= set(Image.model_fields)
        readers.needs(backend(name).audit_in)  # the reader back-end its launchers audit with exists
    # The audit's back-ends are found by their modules' prefix: the reader script is not one of them.
    assert readers.READERS.names() == ["local", "docker"]


def test_a_backend_registered_outside_its_own_module_is_refused():
    from bench.serve.registry import Registry

    registry: Registry[type] = Registry("bench.serve", "launch_")
    with pytest.raises(TypeError, match=r"bench\.serve\.launch_elsewhere"):
        registry.register("elsewhere")(type("Elsewhere", (), {}))
    with pytest.raises(KeyError, match="no back-end 'nowhere'"):
        registry.entry("nowhere")


def test_the_local_backend_removes_a_results_folders_leftovers_only(tmp_path):
    from bench.serve.launchers import backend

    procs = {}
    for name in ("a", "b"):
        run_dir = tmp_path / name / "r" / "cells" / "c" / "run-1"
        run_dir.mkdir(parents=True)
        procs[name] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                                       env={**os.environ, "REGBENCH_RUN_DIR": str(run_dir)})
    try:
        removed, kept = backend("local").leftovers("r", tmp_path / "b" / "r")
        assert removed == [f"local server process {procs['b'].pid}"] and kept == []
        assert procs["b"].wait(10) is not None and procs["a"].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_clean_leaves_the_servers_of_a_bench_that_still_runs(tmp_path):
    """On a shared host `regbench clean` removes only what benches that are gone left: a server
    whose bench still runs (here: this test process), or ran on another host, is kept and said;
    --all removes it too."""
    import socket

    from bench.serve.reap import OWNER_VAR, owner_gone, owner_tag

    # A run id of its own: `clean --all` takes whatever carries the id, other tests' servers too.
    run_id = f"clean-{os.getpid()}-{tmp_path.name}"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owners = {"live": owner_tag(), "dead": f"{socket.gethostname()}:{dead.pid}:1.00",
              "elsewhere": f"other-host.invalid:{os.getpid()}:1.00"}
    assert owner_gone(owners["dead"]) == (True, "")
    assert not owner_gone(owners["live"])[0] and not owner_gone(owners["elsewhere"])[0]
    procs = {}
    for name, owner in owners.items():
        run_dir = tmp_path / name / run_id / "cells" / "c" / "run-1"
        run_dir.mkdir(parents=True)
        procs[name] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                                       env={**os.environ, "REGBENCH_RUN_DIR": str(run_dir), OWNER_VAR: owner})
    try:
        wait_until(lambda: {p.pid for p in procs.values()} <= set(labelled_processes(run_id)), 30, "all labelled")
        out = subprocess.run([sys.executable, "-m", "bench", "clean", "--run-id", run_id], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"local launcher: removed 1 leftover(s): local server process {procs['dead'].pid}" in out.stdout
        assert f"local server process {procs['live'].pid}: its bench (pid {os.getpid()} on this host) is still running" \
            in out.stdout
        assert "its bench ran on host other-host.invalid" in out.stdout and "--all removes them too" in out.stdout
        assert procs["dead"].wait(10) is not None
        assert procs["live"].poll() is None and procs["elsewhere"].poll() is None
        forced = subprocess.run([sys.executable, "-m", "bench", "clean", "--run-id", run_id, "--all"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert "local launcher: removed 2 leftover(s)" in forced.stdout, forced.stdout
        assert procs["live"].wait(10) is not None and procs["elsewhere"].wait(10) is not None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_the_model_info_cache_is_one_folder_per_interpreter_and_overlay_set(minimal, tmp_path):
    from bench.serve.launch_local import model_info_folder, share_model_infos

    minimal["images"].append({**minimal["images"][0], "name": "other", "pythonpath": ["/overlay/x"]})
    config = parse_config(minimal)
    first, other = config.images
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": "/nowhere"}
    folder = model_info_folder(first, env)
    assert folder.parent == tmp_path / "xdg" / "regbench" / "modelinfos"
    assert folder == model_info_folder(first.model_copy(), env) != model_info_folder(other, env)
    assert model_info_folder(first, {"HOME": "/h"}).is_relative_to("/h/.cache/regbench")
    scratch = tmp_path / "scratch"
    share_model_infos(scratch, folder)
    (scratch / "cache" / "modelinfos" / "entry.json").write_text("{}")
    shutil.rmtree(scratch)  # as the launcher removes a server's scratch folder: the link, not its target
    assert (folder / "entry.json").read_text() == "{}"
    # A cache folder that cannot be made (here a file stands in its way: the suite may run as root,
    # whom permissions do not stop) leaves the server a cold cache of its own, and no link.
    locked = tmp_path / "locked"
    locked.write_text("")
    share_model_infos(tmp_path / "scratch2", locked / "modelinfos")
    assert not (tmp_path / "scratch2" / "cache" / "modelinfos").exists()
    assert parse_config(minimal).server.model_info_cache
    minimal["server"] = {"model_info_cache": False}
    assert not parse_config(minimal).server.model_info_cache


def test_inductors_precompiled_headers_are_one_folder_linked_where_torch_looks(minimal, tmp_path):
    import getpass

    from bench.serve.launch_local import inductor_header_folder, share_inductor_headers, torch_user

    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": "/nowhere"}
    folder = inductor_header_folder(env)
    assert folder == tmp_path / "xdg" / "regbench" / "inductor-headers"
    assert inductor_header_folder({"HOME": "/h"}).is_relative_to("/h/.cache/regbench")
    # The name torch itself gives its folder, from the same environment (getpass reads it).
    assert torch_user({"USER": "a/b"}) == "a_b"
    assert torch_user(dict(os.environ)) == re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    scratch = tmp_path / "scratch"
    share_inductor_headers(scratch, folder, "u")
    # Where torch looks in the server: tempfile.gettempdir() under the server's TMPDIR.
    tempdir = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                             env={**os.environ, "TMPDIR": str(scratch / "tmp")}, capture_output=True, text=True,
                             check=True).stdout.strip()
    (Path(tempdir) / "torchinductor_u" / "precompiled_headers" / "h.gch").write_text("x")
    shutil.rmtree(scratch)  # the launcher removes the scratch folder: the link, not its target
    assert (folder / "h.gch").read_text() == "x"
    locked = tmp_path / "locked"
    locked.write_text("")
    share_inductor_headers(tmp_path / "scratch2", locked / "headers", "u")
    assert not (tmp_path / "scratch2" / "tmp").exists()
    assert parse_config(minimal).server.inductor_header_cache
    minimal["server"] = {"inductor_header_cache": False}
    assert not parse_config(minimal).server.inductor_header_cache
