"""Files: the results directory of one run, written as things happen and read back for reports.

Layout of results/<run-id>/:
    config.yaml            the matrix as run (paths resolved)
    plan.json              the cells this run set out to do, when it started and ended (bench.core.results.RunPlan)
    fingerprint.jsonl      one Fingerprint per image
    preflight.jsonl        inspect and audit of the weights, before any server
    requests.jsonl         one RequestRecord per request, appended as each one finishes
    runs.jsonl             one RunRecord per fresh server, appended as each one is reaped
    cells/<cell-id>/run-<n>/server.log    the server's whole output
    summary.json, summary.md              derived from the JSONL files only
    junit.xml, report.html                derived too: bench.report.summary.render_all of one
                                          bench.report.model.Report, written by bench.store.publish

Each JSON line is flushed and fsynced before the bench moves on, so a killed bench loses at
most the line it was writing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel

from bench.core.config import Config
from bench.core.errors import EXIT_WRITE, RegbenchError
from bench.core.matrix import expand
from bench.core.records import Fingerprint, JobRecord, PreflightRecord, RequestRecord, RunRecord, ServerLog, Summary
from bench.core.redact import Redactor, redactor_for
from bench.core.results import Results, RunPlan

T = TypeVar("T", bound=BaseModel)


def new_run_id(config_name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{config_name}"


class ResultsError(RegbenchError):
    """A results folder that cannot be read or continued."""


class ResultsWriteError(ResultsError):
    """A record could not be written (disk full, folder gone or read-only): the run cannot go on."""

    exit_code = EXIT_WRITE
    after = "; every server was stopped"


class FolderBusy(ResultsError):
    """Another bench is writing the folder."""


LOCK_NAME = ".writer.lock"


@contextmanager
def writer_lock(path: Path, wait_s: float = 0.0) -> Iterator[None]:
    """One bench writes a results folder at a time: two would append the same repeats twice.

    An flock on a file in the folder, held while the bench runs. The kernel drops it however the
    holder ends, SIGKILL included, and Linux NFS clients carry it across nodes. That is what a
    resubmitted Slurm job needs: Slurm reports a job over its time limit as ended while its bench
    is still stopping its server and writing (measured: 6 s after the state read TIMEOUT), and
    the next attempt, on another node, must not rewrite the folder under it."""
    lock = path / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ResultsError(f"{path}: cannot open {LOCK_NAME}: {exc.strerror}") from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise ResultsError(f"{path}: cannot lock {LOCK_NAME}: {exc.strerror}") from None
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
                    raise FolderBusy(f"{path} is being written by another regbench ({holder}); "
                                     "wait for it to end, or stop it") from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


class ResultsDir:
    def __init__(self, path: Path, redactor: Redactor | None = None):
        # Absolute: run folders label server processes, which must be findable from anywhere.
        self.path = Path(os.path.abspath(path))
        self.warnings: list[str] = []  # what reading had to repair, for the user to see
        # Every record passes through it on its way to disk (bench.core.redact).
        self.redactor = redactor or redactor_for(())
        # The folder in memory once load() has read it; every record added later goes to both.
        self.loaded: Results | None = None

    @classmethod
    def create(cls, root: Path, run_id: str, config: Config) -> ResultsDir:
        path = root / run_id
        path.mkdir(parents=True, exist_ok=False)
        out = cls(path, redactor_for(config.server.env_passthrough))
        write_config(path / "config.yaml", config, out.redactor)
        return out

    def run_dir(self, cell_id: str, repeat: int) -> Path:
        d = self.path / "cells" / cell_id / f"run-{repeat}"
        d.mkdir(parents=True, exist_ok=True)
        log = d / "server.log"
        if log.exists():  # an attempt that a crash cut short: kept as evidence, not appended to
            attempt = 1 + sum(1 for _ in d.glob("server.log.attempt-*"))
            log.rename(d / f"server.log.attempt-{attempt}")
        return d

    def _append(self, name: str, record: BaseModel) -> None:
        try:
            with open(self.path / name, "a", encoding="utf-8") as f:
                f.write(self.redactor.text(record.model_dump_json()) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise ResultsWriteError(f"cannot write {self.path / name}: {exc.strerror or exc}") from None

    def add_request(self, record: RequestRecord) -> None:
        self._append("requests.jsonl", record)
        if self.loaded is not None:
            self.loaded.add_request(record)

    def add_run(self, record: RunRecord, log: ServerLog | None = None) -> None:
        """The run's record; `log`: its server log as the judge reads it, for the folder in
        memory (the log itself is in the folder already)."""
        self._append("runs.jsonl", record)
        if self.loaded is not None:
            self.loaded.add_run(record, log if log is not None else self.server_log(record))

    def add_preflight(self, record: PreflightRecord) -> None:
        self._append("preflight.jsonl", record)
        if self.loaded is not None:
            self.loaded.add_preflight(record)

    def preflights(self) -> list[PreflightRecord]:
        return self._read("preflight.jsonl", PreflightRecord)

    def add_fingerprint(self, record: Fingerprint) -> None:
        self._append("fingerprint.jsonl", record)
        if self.loaded is not None:
            self.loaded.add_fingerprint(record)

    def write_plan(self, plan: RunPlan) -> None:
        """plan.json, replaced whole: a reader sees the old plan or the new one."""
        tmp = self.path / ".plan.json.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(plan.model_dump_json(indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path / "plan.json")
        except OSError as exc:
            raise ResultsWriteError(f"cannot write {self.path / 'plan.json'}: {exc.strerror or exc}") from None
        if self.loaded is not None:
            self.loaded.plan = plan

    def plan(self, config: Config, runs: list[RunRecord]) -> RunPlan:
        """plan.json; for a folder written before there was one, what it tells of the plan: the
        cells its summary.json listed (the one thing only it records), else every cell of the matrix."""
        path = self.path / "plan.json"
        try:
            if path.exists():
                return RunPlan.model_validate_json(path.read_text(encoding="utf-8"))
            legacy = self.path / "summary.json"
            if legacy.exists():
                old = Summary.model_validate_json(legacy.read_text(encoding="utf-8"))
                return RunPlan(run_id=self.path.name, config_name=config.name, cells=[c.cell_id for c in old.cells],
                               started_at=old.started_at, finished_at=old.finished_at, interrupted=old.interrupted)
        except (OSError, ValueError) as exc:
            raise ResultsError(f"{path if path.exists() else self.path / 'summary.json'}: unreadable: "
                               f"{str(exc).splitlines()[0]}") from None
        return RunPlan(run_id=self.path.name, config_name=config.name, cells=[c.id for c in expand(config)],
                       started_at=min((r.server.started_at for r in runs), default=0.0))

    @property
    def data(self) -> Results:
        """The folder in memory: loaded at the first use."""
        return self.loaded or self.load()

    def load(self, config: Config | None = None) -> Results:
        """The whole folder in memory, read once; records added later are appended to it too.
        `config`: the matrix as the bench holds it (its devices may be narrowed by a flag),
        instead of config.yaml's."""
        config = config or self.config()
        runs = self.runs()
        logs = {(r.cell_id, r.repeat): log for r in runs if (log := self.server_log(r)) is not None}
        self.loaded = Results(config=config, plan=self.plan(config, runs), runs=runs, requests=self.requests(),
                              fingerprints=self.fingerprints(), preflights=self.preflights(), jobs=self.jobs(),
                              logs=logs)
        return self.loaded

    def server_log(self, run: RunRecord) -> ServerLog | None:
        """What the judge reads of a run's server log; None for an interrupted run (not judged)
        or a log that is gone. Only inside the folder, whatever the record says."""
        path = (self.path / run.server.log_path).resolve()
        if run.interrupted or not path.is_relative_to(self.path.resolve()) or not path.is_file():
            return None
        shutdown = read_log(path, run.server.stop_requested_at_byte or 0) if run.server.boot_s is not None else ""
        return ServerLog(shutdown=shutdown, tail=log_tail(path))

    def _read(self, name: str, model: type[T]) -> list[T]:
        records, partial = read_jsonl(self.path / name, model)
        if partial is not None:
            self.warnings.append(f"{name}: dropped a half-written last line ({len(partial)} bytes)")
        return records

    def requests(self) -> list[RequestRecord]:
        return self._read("requests.jsonl", RequestRecord)

    def runs(self) -> list[RunRecord]:
        return self._read("runs.jsonl", RunRecord)

    def fingerprints(self) -> list[Fingerprint]:
        return self._read("fingerprint.jsonl", Fingerprint)

    def jobs(self) -> list[JobRecord]:
        """The cluster jobs that made this folder (slurm.jsonl), if an executor wrote them."""
        return self._read("slurm.jsonl", JobRecord) if (self.path / "slurm.jsonl").is_file() else []

    def config(self) -> Config:
        path = self.path / "config.yaml"
        try:
            return Config.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        except (OSError, yaml.YAMLError, ValueError) as exc:
            raise ResultsError(f"{path}: not the config of a run: {str(exc).splitlines()[0]}") from None

    def prepare_resume(self) -> set[tuple[str, int]]:
        """Makes the folder ready to continue after a crash or kill: drops half-written lines,
        interrupted runs and the requests of runs that never finished (they will be run again,
        and must not count twice). Returns the (cell id, repeat) pairs that are done."""
        if not (self.path / "config.yaml").is_file():
            raise ResultsError(f"{self.path}: not a regbench results directory (no config.yaml)")
        runs = [r for r in self.runs() if not r.interrupted]
        done = {(r.cell_id, r.repeat) for r in runs}
        requests = [q for q in self.requests() if (q.cell_id, q.repeat) in done]
        self._rewrite("runs.jsonl", runs)
        self._rewrite("requests.jsonl", requests)
        for name, model in (("fingerprint.jsonl", Fingerprint), ("preflight.jsonl", PreflightRecord)):
            self._rewrite(name, self._read(name, model))
        return done

    def _rewrite(self, name: str, records: Sequence[BaseModel]) -> None:
        if not (self.path / name).exists():
            return
        tmp = self.path / f".{name}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(r.model_dump_json() + "\n" for r in records)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / name)



def write_config(path: Path, config: Config, redactor: Redactor | None = None) -> None:
    """The matrix as resolved (paths absolute, profiles and overrides applied), as YAML that
    ``load_config`` and ``ResultsDir.config`` read back to the same matrix. A secret written into
    the matrix itself is masked in the copy (a resumed run then needs it from the environment,
    where it belongs). Masked value by value, not in the YAML text: "[REDACTED]" unquoted would
    read back as a list."""
    redactor = redactor or redactor_for(config.server.env_passthrough)
    data = _map_strings(config.model_dump(mode="json"), redactor.text)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def _map_strings(data, f):
    if isinstance(data, str):
        return f(data)
    if isinstance(data, list):
        return [_map_strings(v, f) for v in data]
    if isinstance(data, dict):
        return {k: _map_strings(v, f) for k, v in data.items()}
    return data


def read_jsonl(path: Path, model: type[T]) -> tuple[list[T], str | None]:
    """Records of a JSONL file, and the half-written last line if a killed writer left one.

    Every line but the last was complete when the next one was begun (each is fsynced), so
    only the last can be partial; a bad line anywhere else is damage, not a crash, and raises."""
    if not path.exists():
        return [], None
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    partial = None
    if lines[-1] == "":
        lines.pop()
    else:
        partial = lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(model.model_validate_json(line))
        except ValueError as exc:
            raise ResultsError(f"{path}:{number}: not a {model.__name__} record: {str(exc).splitlines()[0]}") from None
    return records, partial


def read_log(path: Path, start: int = 0) -> str:
    """The log from byte `start` on, decoded leniently: a log is evidence, not input."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return ""
    text = read_log(path, max(0, size - 64 * 1024))
    return "\n".join(text.splitlines()[-lines:])


def read_log_bytes(path: Path, start: int, length: int) -> bytes:
    """At most `length` bytes of a log from byte `start`; b"" if the log is gone."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, start))
            return f.read(max(0, length))
    except FileNotFoundError:
        return b""
