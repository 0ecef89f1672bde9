"""Device slots: disjoint sets inside one bench, host-wide locks across benches, and the runner
running cells side by side without ever putting two servers on one device."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from bench.core.config import ConfigError, parse_config, parse_devices, with_devices
from bench.core.matrix import expand
from bench.core.records import Devices
from bench.core.stop import Stopped, StopToken
from bench.runner import run_matrix
from bench.serve.launch import device_env
from bench.serve.launch_docker import container_env, run_options
from bench.serve.launch_local import device_argv
from bench.serve.lifecycle import Server
from bench.serve.slots import SlotPool, shared_devices
from bench.store.results import ResultsDir

from .support import ROOT, ScriptedLauncher, wait_until

FAKEPROC = Path(__file__).parent / "fakeproc.py"


def test_the_pool_never_hands_one_device_to_two_holders(tmp_path):
    pool = SlotPool("gpu", [str(i) for i in range(4)], tmp_path, poll_s=0.01)
    held: set[str] = set()
    guard = threading.Lock()
    clashes = []

    def user(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(30):
            got = pool.acquire(rng.choice([1, 1, 2, 3]))
            with guard:
                if held & set(got.ids):
                    clashes.append(got.ids)
                held.update(got.ids)
            time.sleep(rng.random() / 500)
            with guard:
                held.difference_update(got.ids)
            pool.release(got)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert clashes == []


def test_another_bench_holding_a_device_is_waited_for_and_its_death_frees_it(tmp_path):
    # Another bench: a process holding the device's lock the way SlotPool does.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path; from bench.serve.slots import SlotPool\n"
        f"p = SlotPool('gpu', ['0'], Path({str(tmp_path)!r})); p.acquire(1)\n"
        "print('held', flush=True); import time; time.sleep(120)"
    )], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    assert holder.stdout.readline().strip() == "held"
    pool = SlotPool("gpu", ["0"], tmp_path, poll_s=0.05)
    messages: list[str] = []
    got: list[Devices] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(1, waiting=messages.append)))
    waiter.start()
    wait_until(lambda: bool(messages), 30, "the waiting message")
    assert got == [] and waiter.is_alive()
    assert messages and f"pid {holder.pid}" in messages[0]
    holder.send_signal(signal.SIGKILL)  # a SIGKILLed bench cannot unlock: the kernel does
    holder.wait()
    waiter.join(10)
    assert got == [Devices(kind="gpu", ids=("0",))]


def test_waiting_ends_when_the_run_is_stopped(tmp_path):
    pool = SlotPool("cpu", ["0"], tmp_path, poll_s=0.05)
    first = pool.acquire(1)
    stop = StopToken()
    threading.Timer(0.3, stop.stop, args=("test",)).start()
    with pytest.raises(Stopped):
        pool.acquire(1, stop)
    pool.release(first)
    assert pool.acquire(1).ids == ("0",)
    with pytest.raises(ValueError):
        pool.acquire(2)


def test_devices_bind_local_servers_and_containers():
    gpu, cpu = Devices(kind="gpu", ids=("2", "3")), Devices(kind="cpu", ids=("1",))
    assert device_env(gpu) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert device_env(cpu) == {"VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert device_env(Devices(kind="cpu", ids=("0", "1"))) == {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # a list per rank
    assert device_argv(cpu, ["vllm"]) == ["taskset", "--cpu-list", "1", "vllm"]
    assert device_argv(gpu, ["vllm"]) == ["vllm"] and device_env(None) == {} and device_argv(None, ["v"]) == ["v"]

    from bench.core.config import Platform

    h200 = Platform.model_validate({"name": "h200", "docker": {"gpus": "all"}, "devices": ["0", "1", "2", "3"]})
    (request,) = run_options(h200, gpu)["device_requests"]
    assert request["DeviceIDs"] == ["2", "3"] and request["Count"] == 0  # these two, not "all"
    assert run_options(h200)["device_requests"][0]["Count"] == -1
    assert run_options(Platform(name="cpu"), cpu)["cpuset_cpus"] == "1"
    thor = Platform.model_validate({"name": "thor", "docker": {"runtime": "nvidia"}})
    assert "device_requests" not in run_options(thor, Devices(kind="gpu", ids=("0",)))


def matrix(minimal: dict, devices: list[str], **extra) -> dict:
    minimal["models"] = [{"name": "m1", "path": "/m"}, {"name": "m2", "path": "/m"}]
    minimal["workload"]["min_tokens"] = minimal["workload"]["max_tokens"] = 16
    minimal["profiles"] = [{"name": "cpu", "devices": devices, "device_kind": "cpu"}]
    minimal["preflight"] = False
    minimal.update(extra)
    return minimal


def test_docker_containers_get_their_devices_in_the_environment(minimal):
    cfg = parse_config(matrix(minimal, ["0", "1"]))
    cell = expand(cfg)[0]
    assert container_env(cell, cfg, {}, Devices(kind="cpu", ids=("1",)))["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    # A cell carries its platform's profile: the nvidia runtime's way of naming devices.
    thor = cell.model_copy(update={"profile": cell.profile.model_copy(
        update={"device_kind": "gpu", "docker": cell.profile.docker.model_copy(update={"runtime": "nvidia"})})})
    assert container_env(thor, cfg, {}, Devices(kind="gpu", ids=("0",)))["NVIDIA_VISIBLE_DEVICES"] == "0"


def test_four_cells_on_two_devices_run_side_by_side_and_never_share_one(tmp_path, minimal):
    cfg = parse_config(matrix(minimal, ["0", "1"]))
    results = ResultsDir.create(tmp_path, "r", cfg)
    summary = run_matrix(cfg, expand(cfg), results, launcher=ScriptedLauncher(["ok"], together=2),
                         locks=tmp_path / "locks").summary
    runs = results.runs()
    assert len(runs) == 4 and {c.verdict for c in summary.cells} == {"pass"}
    assert shared_devices(runs) == []
    assert {r.server.devices.ids for r in runs} == {("0",), ("1",)}
    spans = sorted((r.server.started_at, r.server.ended_at) for r in runs)
    assert any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans)), "never two at once"
    at_once = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert at_once == 2


def test_shared_devices_finds_an_overlap_in_records(tmp_path, minimal):
    cfg = parse_config(matrix(minimal, ["0"]))
    results = ResultsDir.create(tmp_path, "r", cfg)
    run_matrix(cfg, expand(cfg)[:2], results, launcher=ScriptedLauncher(["ok"]), locks=tmp_path / "locks")
    a, b = results.runs()
    assert shared_devices([a, b]) == []
    moved = b.model_copy(update={"server": b.server.model_copy(update={"started_at": a.server.ended_at - 0.01})})
    assert shared_devices([a, moved]) == [("cpu0", f"{a.cell_id}#1", f"{b.cell_id}#1")]


def test_a_tensor_parallel_cell_takes_several_devices(tmp_path, minimal):
    data = matrix(minimal, ["0", "1", "2"])
    data["models"][0]["tensor_parallel_size"] = 2
    cfg = parse_config(data)
    results = ResultsDir.create(tmp_path, "r", cfg)
    run_matrix(cfg, expand(cfg), results, launcher=ScriptedLauncher(["ok"]), locks=tmp_path / "l")
    sizes = {r.cell_id.split("__")[0]: len(r.server.devices.ids) for r in results.runs()}
    assert sizes == {"m1": 2, "m2": 1} and shared_devices(results.runs()) == []
    cell = next(c for c in expand(cfg) if c.model.name == "m1")
    from bench.serve.launch import serve_args

    assert serve_args(cell, cfg.server, 8000, "/m")[-2:] == ["--tensor-parallel-size", "2"]


@pytest.fixture
def ctrl_c_raises():
    """As `regbench run` makes sure (bench.cli): a test process started in the background may
    have inherited SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_every_concurrent_server(tmp_path, minimal, ctrl_c_raises):
    cfg = parse_config(matrix(minimal, ["0", "1"]))
    results = ResultsDir.create(tmp_path, "r", cfg)
    main = threading.get_ident()
    launcher = ScriptedLauncher(["hang"])

    def interrupt_once_both_serve():
        launcher.wait_for_requests(2)  # a request in flight on each of the two servers
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt_once_both_serve, daemon=True).start()
    t0 = time.monotonic()
    summary = run_matrix(cfg, expand(cfg), results, launcher=launcher, locks=tmp_path / "l").summary
    assert time.monotonic() - t0 < 10  # not the 30 s each hanging request would take
    assert summary.interrupted
    runs = results.runs()
    assert len(runs) == 2 and all(r.interrupted for r in runs)  # the two that were serving


def test_device_settings_are_checked(minimal):
    assert parse_devices("0,2-4") == ["0", "2", "3", "4"] and parse_devices("none") == []
    for bad in ("a", "3-1", "0,0", "-1", ""):
        with pytest.raises(ConfigError):
            parse_devices(bad)
    data = matrix(minimal, ["0"])
    data["models"][0]["server_args"] = ["--tensor-parallel-size=2"]
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        parse_config(data)
    data = matrix(minimal, ["0"])
    data["server"] = {"args": ["-tp", "2"]}
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        parse_config(data)
    del data["server"]
    data = matrix(minimal, ["0", "0"])
    with pytest.raises(ConfigError, match="duplicate devices"):
        parse_config(data)
    cfg = with_devices(parse_config(matrix(minimal, [])), "0-1")
    assert cfg.profile("cpu").devices == ["0", "1"]


def test_a_cell_needing_more_devices_than_the_host_has_is_refused_before_anything_runs(tmp_path, minimal):
    data = matrix(minimal, ["0"])
    data["models"][0]["tensor_parallel_size"] = 2
    cfg = parse_config(data)
    with pytest.raises(ConfigError, match="needs 2 devices"):
        run_matrix(cfg, expand(cfg), ResultsDir.create(tmp_path, "r", cfg), launcher=ScriptedLauncher(["ok"]))


def test_a_real_server_process_is_pinned_to_its_cpus(tmp_path):
    from bench.serve.launch_local import ProcessGroup
    from bench.serve.ports import free_port

    port = free_port()
    argv = device_argv(Devices(kind="cpu", ids=("0",)), [sys.executable, str(FAKEPROC), str(port), "children"])
    log = tmp_path / "server.log"
    server = Server(lambda: ProcessGroup(argv, dict(os.environ), tmp_path, log, tmp_path / "scratch"),
                    argv, port, log, 20, 5, devices=Devices(kind="cpu", ids=("0",)))
    with server:
        def printed_pids():
            return [int(line.split("pid=")[1]) for line in log.read_text().splitlines() if "pid=" in line]

        wait_until(lambda: len(printed_pids()) == 2, 30, "the server and its child to print their pids")
        pids = printed_pids()
        assert len(pids) == 2  # the server and its child
        for pid in pids:
            status = Path(f"/proc/{pid}/status").read_text()
            assert "Cpus_allowed_list:\t0\n" in status
    assert server.outcome.devices.ids == ("0",) and server.outcome.ended_at >= server.outcome.started_at


def test_plan_refuses_a_cell_needing_more_devices_than_its_platform_lists_as_run_does(tmp_path, capsys):
    from bench.cli import main

    matrix = yaml.safe_load((ROOT / "configs" / "h200.yaml").read_text())
    matrix["models"][0]["tensor_parallel_size"] = 16
    path = tmp_path / "h200.yaml"
    path.write_text(yaml.safe_dump(matrix))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "needs 16 devices (tensor_parallel_size) and platform h200 lists 8" in err and "Traceback" not in err
    assert main(["plan", str(path), "--format", "github-matrix"]) == 2
    assert main(["run", str(path), "--platform", "h200", "--results", str(tmp_path / "r")]) == 2
    assert "needs 16 devices" in capsys.readouterr().err
    matrix["models"][0]["tensor_parallel_size"] = 8
    path.write_text(yaml.safe_dump(matrix))
    assert main(["plan", str(path)]) == 0
