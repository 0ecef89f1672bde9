"""Slices of a matrix for CI systems whose job matrix is the distributed engine (pure).

regbench does not schedule across hosts: a CI matrix runs one slice per job (a platform, a
shard, or named cells), every slice under the same run id, and `regbench merge` puts the slices'
results folders back together. Shards are assigned round-robin over the expansion order, so a
given matrix always splits the same way.
"""

from __future__ import annotations

import json
import re

from bench.core.config import Config, ConfigError
from bench.core.matrix import Cell

SHARD = re.compile(r"^(\d+)/(\d+)$")


def parse_shard(text: str) -> tuple[int, int]:
    m = SHARD.match(text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"--shard {text!r}: use I/N with 1 <= I <= N, e.g. 1/2")
    return int(m.group(1)), int(m.group(2))


def slice_cells(cells: list[Cell], cell_ids: list[str] | None = None, shard: tuple[int, int] | None = None) -> list[Cell]:
    if cell_ids:
        known = {c.id for c in cells}
        unknown = [i for i in cell_ids if i not in known]
        if unknown:
            raise ConfigError(f"--cell: no such cell {unknown}; `regbench plan` lists them")
        cells = [c for c in cells if c.id in set(cell_ids)]
    if shard is not None:
        index, count = shard
        cells = [c for i, c in enumerate(cells) if i % count == index - 1]
    if not cells:
        raise ConfigError("this slice holds no cell")
    return cells


def github_matrix(config: Config, cells: list[Cell], shards_per_platform: int = 1) -> str:
    """The JSON a GitHub Actions `strategy.matrix` takes: one entry per platform (and shard),
    with the runner labels of the platform's profile."""
    include = []
    for platform in config.platforms:
        if not any(c.platform == platform for c in cells):
            continue
        labels = config.profile(platform).runner_labels or ["self-hosted"]
        for i in range(1, shards_per_platform + 1):
            include.append({"platform": platform, "shard": f"{i}/{shards_per_platform}", "runs-on": labels})
    return json.dumps({"include": include})
