"""A Docker engine that accepts GPU requests on a host without GPUs, for the tests.

Docker 20.10 (Debian's docker.io) registers its NVIDIA device driver at daemon start when an
executable named `nvidia-container-runtime-hook` is on dockerd's PATH (moby daemon/nvidia_linux.go):
a container with a GPU request then gets NVIDIA_VISIBLE_DEVICES (the ids, a count or `all`) in its
environment, and the hook runs as its OCI prestart hook. scripts/gpu-standin/ holds a stand-in hook
that records what it was given and exits 0. `StandinEngine` starts a dockerd of its own with that
hook on its PATH (own data root, exec root, pid file and unix socket in a temp folder, no bridge,
no iptables: it touches nothing of the shared engine), and a tiny image whose entrypoint prints
its environment (`env`) or waits until it is killed (`pause`): a static C program of a few lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from pathlib import Path

import docker
import psutil

from .support import wait_until

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "scripts" / "gpu-standin" / "nvidia-container-runtime-hook"
IMAGE = "regbench/gpu-standin:env"
PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) if (strcmp(argv[i], "pause") == 0) for (;;) pause();
  for (char **e = environ; *e; e++) puts(*e);
  return 0;
}
"""
# Jetson's `nvidia` runtime (a runc wrapper that reads NVIDIA_VISIBLE_DEVICES) stood in by runc
# itself under that name: what the test sees is the environment the container was created with.
RUNC = shutil.which("runc") or "/usr/sbin/runc"
START_S = 60.0
STOP_S = 60.0


def available() -> str | None:
    """Why the stand-in engine cannot be started here, or None."""
    if os.geteuid() != 0:
        return "needs root (dockerd)"
    for tool in ("dockerd", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def rootfs_tar(folder: Path) -> Path:
    """A root filesystem of one static program, as a tarball: /env, and the same as
    /usr/bin/python3, so that a server container (`python3 -m vllm... ARGS`) runs it too."""
    (folder / "env.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(folder / "env"), str(folder / "env.c")], check=True)
    tar = folder / "rootfs.tar"
    with tarfile.open(tar, "w") as t:
        t.add(folder / "env", arcname="env")
        t.add(folder / "env", arcname="usr/bin/python3")
    return tar


class StandinEngine:
    def __init__(self) -> None:
        # A short path: the unix socket's must fit in 108 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="rbgpu-", dir="/tmp"))
        self.bin = self.dir / "bin"
        self.bin.mkdir()
        shutil.copy(HOOK, self.bin / HOOK.name)
        self.records = self.dir / "records"  # where the hook writes (next to its bin folder)
        self.socket = self.dir / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None
        self.client: docker.DockerClient | None = None

    def start(self) -> StandinEngine:
        env = dict(os.environ, PATH=f"{self.bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")
        with open(self.dir / "dockerd.log", "wb") as log:
            self.proc = subprocess.Popen(
                ["dockerd", "--data-root", str(self.dir / "data"), "--exec-root", str(self.dir / "exec"),
                 "--pidfile", str(self.dir / "docker.pid"), "-H", self.url, "--bridge=none", "--iptables=false",
                 "--ip-masq=false", f"--add-runtime=nvidia={RUNC}"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        def answers() -> bool:
            try:
                self.client = docker.DockerClient(base_url=self.url, timeout=60)
                return bool(self.client.ping())
            except docker.errors.DockerException:
                return False

        wait_until(answers, START_S, "the stand-in dockerd to answer", poll=0.2, process=self.proc)
        client = self.client
        assert client is not None
        with open(rootfs_tar(self.dir), "rb") as f:
            client.images.client.api.import_image_from_data(f.read(), repository=IMAGE.split(":")[0], tag="env",
                                                            changes=['ENTRYPOINT ["/env"]'])
        return self

    def image_for(self, ref: str, arch: str) -> None:
        """The tiny image again, as an image of another architecture: `docker save`, the image
        config's `architecture` changed (the config renamed to its new hash), `docker load`. No
        boot needed; the engine then reports that Architecture. (`docker import --platform` is
        not honoured by Docker 20.10 without experimental mode.)"""
        assert self.client is not None
        work = self.dir / f"save-{arch}"
        work.mkdir()
        with open(work / "image.tar", "wb") as f:
            for chunk in self.client.images.get(IMAGE).save():
                f.write(chunk)
        with tarfile.open(work / "image.tar") as t:
            t.extractall(work / "x", filter="data")
        x = work / "x"
        manifest = json.loads((x / "manifest.json").read_text())
        old = manifest[0]["Config"]
        config = json.loads((x / old).read_text())
        config["architecture"] = arch
        data = json.dumps(config).encode()
        new = hashlib.sha256(data).hexdigest() + ".json"
        (x / old).unlink()
        (x / new).write_bytes(data)
        manifest[0].update(Config=new, RepoTags=[ref])
        (x / "manifest.json").write_text(json.dumps(manifest))
        (x / "repositories").unlink(missing_ok=True)
        with tarfile.open(work / "other.tar", "w") as t:
            for item in sorted(x.iterdir()):
                t.add(item, arcname=item.name)
        self.client.images.load((work / "other.tar").read_bytes())

    def gpu_driver(self) -> bool:
        """Whether the engine registered the NVIDIA driver (a GPU request is accepted)."""
        assert self.client is not None
        try:
            out = self.client.containers.run(IMAGE, remove=True, device_requests=[
                docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])])
        except docker.errors.APIError:
            return False
        return b"NVIDIA_VISIBLE_DEVICES=all" in out

    def mounts(self) -> list[str]:
        """Mount points under the engine's folder (dockerd leaves its default netns mounted)."""
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f]
        return [p for p in points if p.startswith(str(self.dir) + "/")]

    def stop(self) -> None:
        if self.client is not None:
            for c in self.client.containers.list(all=True):
                c.remove(force=True)
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_S)
        for point in sorted(self.mounts(), reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        assert not self.dir.exists(), f"{self.dir} left behind"
        left = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
                if any(str(self.dir) in a for a in p.info["cmdline"] or [])]
        assert not left, f"processes of the stand-in engine left running: {left}"
