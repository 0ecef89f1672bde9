"""A real PostgreSQL server for the history database's tests: Debian's `postgresql` binaries
(scripts/setup.sh installs them), a cluster of the tests' own in a scratch folder, listening on a
free port of 127.0.0.1 and on a Unix socket in that folder, started and stopped by the tests.

PostgreSQL refuses to run as root; under root the cluster belongs to the `postgres` user the
package creates (else `nobody`), and its folder is made outside pytest's tmp folders, which only
root may enter. The package's own cluster, if it runs, is left alone.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from .support import free_port, wait_until

SUPERUSER = "regbench"


def binaries() -> Path | None:
    """The folder of initdb and pg_ctl: Debian keeps them off PATH, per major version."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


class PgServer:
    def __init__(self, port: int, folder: Path):
        self.port = port
        self.folder = folder
        self._made = 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def answers(self) -> bool:
        try:
            with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def new_database(self) -> str:
        """An empty database of its own for one test; its SQLAlchemy URL."""
        self._made += 1
        name = f"t{os.getpid()}_{self._made}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_owner(user: pwd.struct_passwd | None, argv: list[str]) -> list[str]:
    return argv if user is None else ["runuser", "-u", user.pw_name, "--", *argv]


@contextmanager
def pg_server(bin_dir: Path) -> Iterator[PgServer]:
    """initdb, pg_ctl start; pg_ctl stop and the folder removed when the block ends, however it ends."""
    user = None
    if os.geteuid() == 0:
        for name in ("postgres", "nobody"):
            try:
                user = pwd.getpwnam(name)
                break
            except KeyError:
                continue
        if user is None:
            raise RuntimeError("running as root and neither a postgres nor a nobody user exists to own the cluster")
    folder = Path(tempfile.mkdtemp(prefix="regbench-pg-"))
    data, log = folder / "data", folder / "server.log"
    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)
    port = free_port()
    server = PgServer(port, folder)
    pg_ctl = str(bin_dir / "pg_ctl")
    started = False
    try:
        # --no-sync and fsync=off: a scratch cluster, thrown away at the end; the tests need its
        # locking and transactions, not its durability.
        init = subprocess.run(_as_owner(user, [str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "-A", "trust",
                                               "--no-sync", "-E", "UTF8"]),
                              capture_output=True, text=True, cwd=folder)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed (exit {init.returncode}): {init.stdout}{init.stderr}")
        options = f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off -c max_connections=40"
        result = subprocess.run(_as_owner(user, [pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w",
                                                 "-t", "60", "start"]),
                                capture_output=True, text=True, cwd=folder)
        started = True  # even a start that timed out may have left a postmaster to stop
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {result.stdout}{result.stderr}\n"
                               + (log.read_text(errors="replace") if log.exists() else ""))
        wait_until(server.answers, 30, f"PostgreSQL on 127.0.0.1:{port} to answer", poll=0.2)
        yield server
    finally:
        if started:
            subprocess.run(_as_owner(user, [pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, cwd=folder)
        shutil.rmtree(folder, ignore_errors=True)
