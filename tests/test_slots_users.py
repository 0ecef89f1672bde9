"""Device locks shared by the benches of several users on one host: a lock folder and lock files
made by one uid (root here) are opened by another (65534, nobody), whose bench then waits for the
device as it would for one of its own, and never fails with a traceback.

The second user runs Debian's /usr/bin/python3 under `setpriv` (the tests' own interpreter lives
under /root, 0700 on these machines: ../shared/FIELD-NOTES.md section 12). That interpreter has no
pydantic, so bench.core.records is stood in for by a module with the two names slots.py takes
from it; the module under test is the checkout's own bench/serve/slots.py, copied with the few
modules it imports to a folder that user can read (a checkout under /root is not)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from bench.serve.slots import LockFolderError, SlotPool

from .support import ROOT

OTHER_UID = 65534
SYSTEM_PYTHON = Path("/usr/bin/python3")

# Run as the other user: takes device 0 of `kind` in the lock folder argv[1], without waiting
# (poll_s and a stop token set after the first look), and prints what became of it.
SECOND_BENCH = textwrap.dedent("""
    import dataclasses, sys, types
    sys.path.insert(0, sys.argv[2])
    records = types.ModuleType("bench.core.records")

    @dataclasses.dataclass(frozen=True)
    class Devices:
        kind: str
        ids: tuple

    records.Devices, records.RunRecord = Devices, object
    sys.modules["bench.core.records"] = records
    from pathlib import Path
    from bench.core.stop import Stopped, StopToken
    from bench.serve.slots import LockFolderError, SlotPool

    class OneLook(StopToken):
        looks = 0

        @property
        def stopped(self):
            self.looks += 1
            return self.looks > 1

    try:
        pool = SlotPool(sys.argv[3], ["0"], Path(sys.argv[1]), poll_s=0.01)
        said = []
        got = pool.acquire(1, OneLook(), said.append)
        print("took", got.ids)
    except Stopped:
        print("waited:", said)
    except LockFolderError as exc:
        print("refused:", exc)
""")


def as_other_user(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", str(SYSTEM_PYTHON), *argv],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
    )


@pytest.fixture
def shared_tmp():
    """A folder under /tmp that the other user can reach (pytest's tmp_path may lie under /root)."""
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root")
    if not SYSTEM_PYTHON.exists() or shutil.which("setpriv") is None:
        pytest.skip("needs /usr/bin/python3 and setpriv")
    base = Path("/tmp") / f"regbench-users-{os.getpid()}"
    base.mkdir(mode=0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


@pytest.fixture
def code(shared_tmp) -> str:
    """The checkout's own modules the second bench imports, copied where the other user can read
    them: a checkout under /root (0700, as CI's may be) is not readable by it."""
    for module in ("bench/__init__.py", "bench/core/__init__.py", "bench/core/errors.py", "bench/core/stop.py",
                   "bench/serve/__init__.py", "bench/serve/slots.py"):
        (shared_tmp / "code" / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / module, shared_tmp / "code" / module)
    for folder in (shared_tmp / "code").rglob("*"):
        os.chmod(folder, 0o755 if folder.is_dir() else 0o644)
    os.chmod(shared_tmp / "code", 0o755)
    return str(shared_tmp / "code")


def test_a_second_user_waits_for_a_device_the_first_holds(shared_tmp, code):
    old_umask = os.umask(0o022)  # the common default, which made the folder 0755 and files 0644
    try:
        locks = shared_tmp / "locks"
        pool = SlotPool("gpu", ["0"], locks)
        held = pool.acquire(1)
    finally:
        os.umask(old_umask)
    done = as_other_user("-c", SECOND_BENCH, str(locks), code, "gpu")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("waited:") and f"pid {os.getpid()}" in done.stdout, done.stdout + done.stderr
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
    assert stat.S_IMODE((locks / "gpu0.lock").stat().st_mode) == 0o666
    pool.release(held)
    done = as_other_user("-c", SECOND_BENCH, str(locks), code, "gpu")
    assert done.stdout.strip() == "took ('0',)", done.stdout + done.stderr
    # The other user created a lock of its own, for root's next bench to open: world-writable too.
    done = as_other_user("-c", SECOND_BENCH, str(locks), code, "cpu")
    assert done.stdout.strip() == "took ('0',)", done.stdout + done.stderr
    assert (locks / "cpu0.lock").stat().st_uid == OTHER_UID
    assert stat.S_IMODE((locks / "cpu0.lock").stat().st_mode) == 0o666


def test_a_lock_folder_another_user_cannot_write_is_a_clear_error(shared_tmp, code):
    # A folder as an older bench left it: 0755, lock file 0644, both root's.
    locks = shared_tmp / "old"
    locks.mkdir(mode=0o755)
    (locks / "gpu0.lock").touch(mode=0o644)
    os.chmod(locks / "gpu0.lock", 0o644)
    done = as_other_user("-c", SECOND_BENCH, str(locks), code, "gpu")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("refused:"), done.stdout + done.stderr
    assert str(locks / "gpu0.lock") in done.stdout and "REGBENCH_LOCK_DIR" in done.stdout
    # Its owner's next bench opens it up for everyone.
    pool = SlotPool("gpu", ["0"], locks)
    pool.release(pool.acquire(1))
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
    assert stat.S_IMODE((locks / "gpu0.lock").stat().st_mode) == 0o666
    done = as_other_user("-c", SECOND_BENCH, str(locks), code, "gpu")
    assert done.stdout.strip() == "took ('0',)", done.stdout + done.stderr


def test_a_lock_folder_that_cannot_be_made_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LockFolderError, match="REGBENCH_LOCK_DIR"):
        SlotPool("gpu", ["0"], blocker / "locks")
