"""`regbench plan`: the cells of a matrix, and the repeats a failure rate needs."""

from __future__ import annotations

import argparse
import json

from bench.console import err, format_flag
from bench.core.config import Config, ConfigError, with_image_refs
from bench.core.matrix import Cell, expand, expected_times
from bench.core.slicing import github_matrix
from bench.core.stats import detection_probability, percent_range, repeats_needed, wilson_interval
from bench.runner import check_devices
from bench.store.matrixfile import load_config


def add_cli_args(sub) -> None:
    plan = sub.add_parser("plan", help="print the cells of a matrix without running anything")
    plan.add_argument("config")
    plan.add_argument("--detect", type=float, metavar="P",
                      help="also print the repeats needed to see a failure of rate P (0 < P <= 1) at least once")
    plan.add_argument("--confidence", type=float, metavar="C",
                      help="with --detect: the probability of seeing it (default 0.95); n = ceil(log(1-C)/log(1-P))")
    format_flag(plan, ["text", "json", "github-matrix", "pins"],
                help="text (default): the plan for people; json: its cells, their baselines and repeats as JSON; "
                     "github-matrix: the JSON of a GitHub Actions strategy.matrix, one entry per platform and shard; "
                     "pins: each image's tag resolved now by its registry (nothing pulled), as the NAME=REPO@sha256:… "
                     "pairs, on one line, that every slice of a run takes as --image to run one build")
    plan.add_argument("--shards", type=int, default=1, metavar="N", help="with github-matrix: shards per platform")
    plan.add_argument("--image", action="append", metavar="NAME=REF", help="replace an image's reference (repeatable)")
    plan.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    config = with_image_refs(load_config(args.config), args.image or [])
    cells = expand(config)
    check_devices(config, cells)  # what `run` would refuse, plan refuses too
    budget = budget_lines(config, cells)  # a plan over its budget is refused in every format
    if args.format == "github-matrix":
        print(github_matrix(config, cells, args.shards))
        return 0
    if args.format == "pins":
        # Here, not at the top: the docker SDK is imported only where an engine is asked.
        from bench.serve.launch_docker import client
        from bench.serve.pins import registry_pins

        pins, notes = registry_pins(config.images, client)
        for note in notes:
            err.print(note, highlight=False)
        print(" ".join(f"{name}={ref}" for name, ref in pins.items()))
        return 0
    n = config.repeat_count
    if args.format == "json":
        print(json.dumps(plan_view(config, cells, args.detect, args.confidence), indent=2))
        return 0
    auto = f" (auto: to see a {config.detect.rate:.0%} failure with {config.detect.confidence:.0%} probability)" \
        if config.repeats == "auto" and config.detect else ""
    t_lines = [f"{config.name}: {len(cells)} cells × {n} repeats{auto} = {len(cells) * n} fresh servers"]
    for c in cells:
        role = "baseline" if c.is_baseline else (f"vs {c.baseline_id}" if c.baseline_id else "no baseline")
        tp = c.model.tensor_parallel_size
        t_lines.append(f"  {c.id}  [{role}]" + (f" [{tp} devices]" if tp > 1 else ""))
    for profile in config.profiles:
        if profile.devices:
            t_lines.append(f"platform {profile.name}: cells side by side on {profile.device_kind} devices "
                           f"{','.join(profile.devices)} (one server per device set; --devices to change)")
    if budget:
        t_lines += ["", *budget]
    if args.detect is not None:
        t_lines += ["", *_detection_lines(args.detect, args.confidence, n, len(cells))]
    elif args.confidence is not None:
        raise ConfigError("--confidence needs --detect P")
    print("\n".join(t_lines))
    return 0


def plan_view(config: Config, cells: list[Cell], detect: float | None, confidence: float | None) -> dict:
    """What `plan --format json` prints: the cells, their baselines and repeats (and with --detect
    the repeats it needs), for scripts; the budget refuses a plan here as in every format."""
    n = config.repeat_count
    view: dict = {
        "name": config.name, "repeats": n, "fresh_servers": len(cells) * n,
        "cells": [{"id": c.id, "is_baseline": c.is_baseline, "baseline_id": c.baseline_id, "platform": c.platform,
                   "devices": c.model.tensor_parallel_size} for c in cells],
    }
    if detect is not None:
        confidence, needed, seen_now = _detection(detect, confidence, n)
        view["detect"] = {"rate": detect, "confidence": confidence, "repeats_needed": needed, "seen_with_repeats": seen_now}
    elif confidence is not None:
        raise ConfigError("--confidence needs --detect P")
    return view


def _detection(p: float, confidence: float | None, repeats: int) -> tuple[float, int, float]:
    """The confidence in effect, the repeats that see a failure of rate `p` with it, and the
    probability that `repeats` see it."""
    confidence = 0.95 if confidence is None else confidence
    try:
        return confidence, repeats_needed(p, confidence), detection_probability(p, repeats)
    except ValueError as exc:
        raise ConfigError(f"--detect/--confidence: {exc}") from None


def _detection_lines(p: float, confidence: float | None, repeats: int, cells: int) -> list[str]:
    confidence, n, seen_now = _detection(p, confidence, repeats)
    return [
        f"to see a failure that happens in {p:.0%} of fresh starts at least once with {confidence:.0%} "
        f"probability: {n} repeats per cell ({cells} cells × {n} = {cells * n} fresh servers)",
        f"the matrix has repeats: {repeats}, which sees it with {seen_now:.0%} probability; "
        f"0 failures in {n} runs would put the failure rate at {percent_range(*wilson_interval(0, n))} (Wilson 95 %)",
    ]


def budget_lines(config: Config, cells: list[Cell]) -> list[str]:
    """The matrix's `budget` stated: each platform's fresh servers and expected wall time, and
    what its repeats can see. Raises ConfigError where a platform's plan does not fit."""
    budget = config.budget
    if budget is None:
        return []
    lines, over = [], []
    for t in expected_times(config, cells):
        spread = f" / {t.devices} devices" if t.devices > 1 else ""
        fits = t.minutes <= budget.minutes
        lines.append(f"{t.platform}: {t.starts} fresh servers × ({budget.boot_minutes:g} min boot + "
                     f"{budget.serve_minutes:g} min serving){spread} + {budget.setup_minutes:g} min setup = "
                     f"{t.minutes:.0f} min ({t.hours:.1f} h), {'within' if fits else 'over'} the budget of "
                     f"{budget.minutes:g} min")
        if not fits:
            over.append(f"{t.platform} ({t.minutes:.0f} min)")
    if over:
        raise ConfigError(f"{config.name}: over its budget of {budget.minutes:g} min: {', '.join(over)}; "
                          "run fewer cells (`include`, `exclude`) or repeats (`repeats`, `detect`), or more devices")
    n = config.repeat_count
    seen = (f", which see a failure of {config.detect.rate:.0%} of starts at least once with "
            f"{detection_probability(config.detect.rate, n):.0%} probability") if config.detect else ""
    lines.append(f"power: {n} fresh servers per cell{seen}; 0 failures in {n} put a cell's failure rate at "
                 f"{percent_range(*wilson_interval(0, n))} (Wilson 95 %)")
    return lines
