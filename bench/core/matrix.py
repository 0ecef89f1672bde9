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
    Invariance,
    Knob,
    LoadFormat,
    Model,
    Platform,
    ReferenceText,
    ServerSettings,
    Workload,
)
from bench.core.tokens import Comparator


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
    # For a knob's cell: the cell without the knob.
    baseline_id: str | None = None
    # Set on the cells an `invariance` block adds: the setting that must not have changed outputs.
    knob: Knob | None = None
    # The logprobs each generated token is asked with: for its own comparison, and for a knob's
    # cell compared with it under `logprobs` (None: none asked).
    logprobs_k: int | None = None

    @property
    def comparator(self) -> Comparator:
        """The rule this cell's outputs are compared by: its `comparison` (a knob's cell: its
        invariance block's), for divergence, twins and nondeterminism alike."""
        return self.comparison.comparator


def _logprobs_k(comparison: Comparison) -> int | None:
    return comparison.top_k if comparison.mode == "logprobs" else None


# Joins an image's name and a knob's in the image axis of a knob's cell: not a character of a
# name, so a knob's cell never shares an id with a cell of the matrix.
KNOB_SEP = "+"


def matrix_image(name: str) -> str:
    """The image of the matrix a cell's image axis stands for: a knob's cell runs its original's
    (one pin, one fingerprint, one pre-flight audit for both)."""
    return name.split(KNOB_SEP, 1)[0]


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
                logprobs_k=_logprobs_k(config.comparison),
            )
        )
    if set(rule) - {"load_format"}:
        cells.sort(key=lambda c: not c.is_baseline)  # stable: product order otherwise
    if config.invariance:
        knobs = [k for block in config.invariance for k in knob_cells(cells, block)]
        twice = sorted({k.id for k in knobs if [x.id for x in knobs].count(k.id) > 1})
        if twice:
            raise ConfigError(f"invariance: two blocks give a cell the same knob: {', '.join(twice)}")
        # The originals answer with the logprobs their knobs' cells are compared under.
        asked: dict[str | None, int] = {}
        for k in knobs:
            asked[k.baseline_id] = max(asked.get(k.baseline_id, 0), k.logprobs_k or 0)
        cells = [c.model_copy(update={"logprobs_k": max(c.logprobs_k or 0, asked[c.id]) or None})
                 if c.id in asked else c for c in cells] + knobs
    return cells


def knob_cells(cells: list[Cell], invariance: Invariance) -> list[Cell]:
    """A cell per picked cell and knob, after all the others: the picked cell with the knob
    applied, its image named `<image>+<knob>`, compared with the picked cell."""
    if invariance.cells:
        picked = [c for c in cells if any(_matches(r, _axes(c)) for r in invariance.cells)]
    else:
        picked = [c for c in cells if c.is_baseline or c.baseline_id is None]
    if not picked:
        raise ConfigError("invariance: its `cells` filters pick no cell of the matrix")
    out = []
    for origin in picked:
        for named in invariance.knobs:
            knob = named.on(origin.profile)  # a per-platform knob as this platform spells it
            image = origin.image.model_copy(update={"name": f"{origin.image.name}{KNOB_SEP}{knob.name}"})
            comparison = knob.comparison or invariance.comparison or origin.comparison
            model = origin.model if knob.tensor_parallel_size is None else \
                origin.model.model_copy(update={"tensor_parallel_size": knob.tensor_parallel_size})
            out.append(origin.model_copy(update={
                "id": cell_id(origin.model.name, origin.load_format.name, origin.platform, image.name),
                "model": model,
                "image": image,
                "workload": _knob_workload(origin.workload, knob),
                "comparison": comparison,
                "logprobs_k": _logprobs_k(comparison),
                "is_baseline": False,
                "baseline_id": origin.id,
                "knob": knob,
            }))
    return out


def _axes(cell: Cell) -> dict[str, str]:
    return {"model": cell.model.name, "load_format": cell.load_format.name, "platform": cell.platform,
            "image": cell.image.name}


def _knob_workload(workload: Workload, knob: Knob) -> Workload:
    update: dict = {}
    if knob.concurrency is not None:
        update["concurrency"] = knob.concurrency
    if knob.stream is not None:
        update["prompts"] = [p.model_copy(update={"stream": {"all": True, "none": False}.get(knob.stream, not p.stream)})
                             for p in workload.prompts]
    return workload.model_copy(update=update)


class PlatformTime(BaseModel):
    """What one platform's share of a matrix is expected to take on one host, from the budget's
    assumed costs (bench.core.config.Budget)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    platform: str
    starts: int  # fresh servers
    devices: int  # side by side: the profile's devices, or 1
    minutes: float

    @property
    def hours(self) -> float:
        return self.minutes / 60


def expected_times(config: Config, cells: list[Cell]) -> list[PlatformTime]:
    """Per platform, in matrix order: its fresh servers (repeats of every cell, knobs' included)
    and the expected wall time: the setup once, then each server's boot and serving, spread over
    the platform's devices as the runner's workers take them (one per device, a server holding
    as many as its tensor-parallel size); without devices, one server after another. A cell that
    settles early (`early_stop`) or cannot run on the host takes less: this is the plan's top."""
    budget = config.budget
    if budget is None:
        raise ConfigError(f"{config.name}: no `budget` to state the expected time with")
    per_start = budget.boot_minutes + budget.serve_minutes
    out = []
    for platform in config.platforms:
        mine = [c for c in cells if c.platform == platform]
        if not mine:
            continue
        devices = len(mine[0].profile.devices) or 1
        # Device-minutes over devices; a server of several devices holds them all meanwhile.
        held = sum(c.repeats * per_start * (c.model.tensor_parallel_size if devices > 1 else 1) for c in mine)
        out.append(PlatformTime(platform=platform, starts=sum(c.repeats for c in mine), devices=devices,
                                minutes=budget.setup_minutes + held / devices))
    return out
