"""What the tests look for after a run: live server processes carrying a results folder's label."""

from __future__ import annotations

from pathlib import Path


def processes_labelled(results: Path) -> list[int]:
    """Pids of live processes whose environment carries a run dir under `results`."""
    found = []
    needle = f"REGBENCH_RUN_DIR={results}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and (entry / "stat").read_text().split()[2] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found
