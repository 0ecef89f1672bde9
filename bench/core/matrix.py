"""Matrix → cells: the pure expansion of a Config into the cells a run starts servers for."""

from __future__ import annotations

from itertools import product

from pydantic import BaseModel, ConfigDict

from bench.core.config import (
    CellFilter,
    Comparison,
    Config,
    ConfigError,
    Image,
    LoadFormat,
    Model,
    Platform,
    ReferenceText,
    ServerSettings,
    Workload,
)


class Cell(BaseModel):
    """One point of the matrix, resolved: everything a stage needs to start, load, query and judge
    its servers is on it, so no stage looks the matrix up again. Each repeat gets a fresh server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    model: Model
    load_format: LoadFormat
    platform: str  # the platform's name; its profile is `profile`
    image: Image
    repeats: int
    profile: Platform
    server: ServerSettings
    workload: Workload
    comparison: Comparison
    reference_text: ReferenceText
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
    """All cells, grouped by (model, platform, image) with the baseline load format first in its
    group; with a baseline rule over other axes, the baseline cells first of all."""
    rule = config.baseline_rule.axes() if config.baseline_rule is not None else {}
    formats = sorted(config.load_formats, key=lambda f: f.name != rule.get("load_format"))
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
        axes = {"model": model.name, "load_format": fmt.name, "platform": platform, "image": image.name}
        own = cell_id(*axes.values())
        is_baseline = bool(rule) and all(axes[k] == v for k, v in rule.items())
        baseline = None
        if rule and not is_baseline:
            candidate = cell_id(*{**axes, **rule}.values())
            baseline = candidate if candidate in ids else None
        cells.append(
            Cell(
                id=own,
                model=model,
                load_format=fmt,
                platform=platform,
                image=image,
                repeats=config.repeat_count,
                profile=config.profile(platform),
                server=config.server,
                workload=config.workload,
                comparison=config.comparison,
                reference_text=config.reference_text,
                is_baseline=is_baseline,
                baseline_id=baseline,
            )
        )
    if set(rule) - {"load_format"}:
        cells.sort(key=lambda c: not c.is_baseline)  # stable: product order otherwise
    return cells
