"""Matrix → cells: the pure expansion of a Config into the cells a run starts servers for."""

from __future__ import annotations

from itertools import product

from pydantic import BaseModel, ConfigDict

from bench.core.config import CellFilter, Config, ConfigError, Image, LoadFormat, Model


class Cell(BaseModel):
    """One point of the matrix; each of its repeats gets a fresh server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    model: Model
    load_format: LoadFormat
    platform: str
    image: Image
    repeats: int
    is_baseline: bool = False
    # The cell this one is compared with token by token; None for baselines and when excluded.
    baseline_id: str | None = None


def cell_id(model: str, load_format: str, platform: str, image: str) -> str:
    # The schema limits names to [A-Za-z0-9._-] without "__", so the id is a safe directory
    # name and two different cells never share one.
    return "__".join((model, load_format, platform, image))


def _matches(rule: CellFilter, axes: dict[str, str]) -> bool:
    return all(getattr(rule, k) in (None, v) for k, v in axes.items())


def expand(config: Config) -> list[Cell]:
    """All cells, grouped by (model, platform, image) with the baseline first in its group."""
    formats = sorted(config.load_formats, key=lambda f: f.name != config.baseline)
    chosen: list[tuple[Model, LoadFormat, str, Image]] = []
    for model, platform, image, fmt in product(
        config.models, config.platforms, config.images, formats
    ):
        axes = {"model": model.name, "load_format": fmt.name, "platform": platform, "image": image.name}
        if config.include and not any(_matches(r, axes) for r in config.include):
            continue
        if any(_matches(r, axes) for r in config.exclude):
            continue
        chosen.append((model, fmt, platform, image))
    if not chosen:
        raise ConfigError(f"{config.name}: include/exclude leave no cell to run")

    ids = {cell_id(m.name, f.name, p, i.name) for m, f, p, i in chosen}
    cells = []
    for model, fmt, platform, image in chosen:
        baseline = None
        if config.baseline is not None and fmt.name != config.baseline:
            candidate = cell_id(model.name, config.baseline, platform, image.name)
            baseline = candidate if candidate in ids else None
        cells.append(
            Cell(
                id=cell_id(model.name, fmt.name, platform, image.name),
                model=model,
                load_format=fmt,
                platform=platform,
                image=image,
                repeats=config.repeat_count,
                is_baseline=fmt.name == config.baseline,
                baseline_id=baseline,
            )
        )
    return cells
