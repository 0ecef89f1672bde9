"""The weight audit's reader as a process of this host, with the image's Python and overlay
(bench.weights.audit): the reader back-end of the local launcher."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import IO

from bench.serve.launch import image_env
from bench.weights.errors import ReaderError
from bench.weights.protocols import READER, TAIL_LINES, ReaderSpec
from bench.weights.readers import register


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


class LocalReader:
    """The reader as a process of this host, in a session of its own (killed as a group), its
    stdout and stderr to files in the scratch folder."""

    def __init__(self, python: str, plan: Path, env: dict[str, str], scratch: Path):
        self.argv = [python, str(READER), str(plan)]
        self.env = env
        self.out_path, self.err_path = scratch / "stdout", scratch / "stderr"
        self.files: list[IO[bytes]] = []
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalReader:
        out, err = self.out_path.open("wb"), self.err_path.open("wb")
        self.files = [out, err]
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         env=self.env, start_new_session=True)
        except OSError as exc:
            self._close()
            raise ReaderError(f"cannot run {self.argv[0]}: {exc}") from None
        return self

    def wait(self, timeout_s: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            return None

    def output(self) -> tuple[str, str]:
        self._close()
        return self.out_path.read_text(encoding="utf-8"), _tail(self.err_path)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _close(self) -> None:
        for f in self.files:
            f.close()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._kill()
        self._close()


@register("local", needs=("python",))
def start(spec: ReaderSpec) -> LocalReader:
    return LocalReader(spec.image.python, spec.plan, image_env(spec.image, dict(os.environ)), spec.scratch)
