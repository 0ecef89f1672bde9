"""`regbench plan`: the cells of a matrix, and the repeats a failure rate needs."""

from __future__ import annotations

import argparse

from bench.core.config import ConfigError, with_image_refs
from bench.core.matrix import expand
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
    plan.add_argument("--format", choices=["text", "github-matrix"], default="text",
                      help="github-matrix: the JSON of a GitHub Actions strategy.matrix, one entry per platform and shard")
    plan.add_argument("--shards", type=int, default=1, metavar="N", help="with github-matrix: shards per platform")
    plan.add_argument("--image", action="append", metavar="NAME=REF", help="replace an image's reference (repeatable)")
    plan.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    config = with_image_refs(load_config(args.config), args.image or [])
    cells = expand(config)
    check_devices(config, cells)  # what `run` would refuse, plan refuses too
    if args.format == "github-matrix":
        print(github_matrix(config, cells, args.shards))
        return 0
    n = config.repeat_count
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
    if args.detect is not None:
        t_lines += ["", *_detection_lines(args.detect, args.confidence, n, len(cells))]
    elif args.confidence is not None:
        raise ConfigError("--confidence needs --detect P")
    print("\n".join(t_lines))
    return 0


def _detection_lines(p: float, confidence: float | None, repeats: int, cells: int) -> list[str]:
    confidence = 0.95 if confidence is None else confidence
    try:
        n = repeats_needed(p, confidence)
        seen_now = detection_probability(p, repeats)
    except ValueError as exc:
        raise ConfigError(f"--detect/--confidence: {exc}") from None
    return [
        f"to see a failure that happens in {p:.0%} of fresh starts at least once with {confidence:.0%} "
        f"probability: {n} repeats per cell ({cells} cells × {n} = {cells * n} fresh servers)",
        f"the matrix has repeats: {repeats}, which sees it with {seen_now:.0%} probability; "
        f"0 failures in {n} runs would put the failure rate at {percent_range(*wilson_interval(0, n))} (Wilson 95 %)",
    ]
