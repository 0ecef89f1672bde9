"""`regbench history`: every cell across the runs in the history database, and where it broke;
`regbench history ingest DIR...`: results folders into it (bench/history/store.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.console import err, format_flag, out
from bench.core.config import ConfigError
from bench.core.errors import EXIT_PASS, EXIT_USAGE, RegbenchError
from bench.core.perf import parse_thresholds, threshold_list, thresholds_in_effect
from bench.history.model import DEFAULT_WINDOW, ORDER_TEXT, ORDERS, series_of
from bench.history.store import DEFAULT_NAME, default_url, ingest, open_history, write_page
from bench.history.table import history_table, regression_lines, slowdown_lines
from bench.history.trend import Trend, render_trend

_URL_HELP = (f"the history database as an SQLAlchemy URL (default: {DEFAULT_NAME} in the results root), e.g. "
             "postgresql+psycopg://regbench@db.example/regbench for one shared by several runners")


def add_cli_args(sub) -> None:
    h = sub.add_parser(
        "history", help="every cell across the runs in the history database, and the run where it broke",
        description="Per cell, the runs in the history in the order they started: image, vLLM and streamer "
                    "versions, verdict, failures/runs with the Wilson 95 % interval; then the first run "
                    "where a passing cell turned failing or flaky, the last run before it that passed and "
                    "the bisect that narrows what changed between them; and each run slower than the last "
                    "--window good runs before it, by regbench compare's bootstrap rule: per metric, the 95 % "
                    "interval of the ratio of medians wholly above the metric's threshold (--threshold). "
                    "--by image or vllm: per cell without its image (one series across the images, one image per "
                    "release), its points ordered by release instead, to name the release that broke it. "
                    "`regbench history ingest DIR...` adds results folders.")
    h.add_argument("--history", metavar="URL", help=_URL_HELP)
    h.add_argument("--results", default="results", metavar="DIR",
                   help=f"the results root whose {DEFAULT_NAME} is the default database (default: results)")
    h.add_argument("--cell", metavar="ID", help="only this cell (model__load-format__platform__image); with --by "
                                                 "image|vllm its series, named as model__load-format__platform__* "
                                                 "or by any of its cells")
    h.add_argument("--by", choices=ORDERS, default="time",
                   help="the order of a cell's points: " + "; ".join(f"{k}: {v}" for k, v in ORDER_TEXT.items())
                        + " (image, vllm: one series per cell without its image, a knob's cell its own; default time)")
    format_flag(h, ["table", "json"], "table (default): per cell a table of its runs, then where it broke and "
                                        "slowed; json: the same as JSON")
    h.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="N",
                   help=f"compare each run's performance with the last N runs of its cell that passed "
                        f"(default {DEFAULT_WINDOW})")
    h.add_argument("--threshold", action="append", default=[], metavar="METRIC=RATIO",
                   help="slowdown threshold of one metric for that comparison, as in regbench compare (repeatable), "
                        f"e.g. boot_s=1.5; metrics and their defaults: {threshold_list()}")
    h.add_argument("--html", metavar="FILE",
                   help="write a self-contained trend page: per cell its verdicts and per metric its medians "
                        "over the runs, breaks and slowdowns marked (instead of the tables)")
    h.set_defaults(func=main)
    actions = h.add_subparsers(dest="action", metavar="ingest")
    ing = actions.add_parser(
        "ingest", help="add results folders to the history (a run already there is left as it is)",
        description="Reads and judges each results folder as `regbench report` does and stores its cells, "
                    "fingerprints and performance medians. Idempotent by run id. Merged slices: ingest the "
                    "merged folder, not a slice (a slice carries the run's id and would stand for it).")
    ing.add_argument("dirs", nargs="+", metavar="DIR")
    # SUPPRESS: not given after `ingest`, the value given before it stands.
    ing.add_argument("--history", metavar="URL", default=argparse.SUPPRESS,
                     help=f"{_URL_HELP.replace('the results root', 'the folders’ parent folder')}")
    ing.set_defaults(func=ingest_main)


def ingest_main(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    url = args.history
    if url is None:
        parents = {d.resolve().parent for d in dirs}
        if len(parents) > 1:
            raise ConfigError("history ingest: the folders are in different parent folders "
                              f"({', '.join(sorted(map(str, parents)))}): name one database with --history URL")
        url = default_url(parents.pop())
    history = open_history(url)
    failed = 0
    try:
        for d in dirs:
            try:
                run_id, stored = ingest(history, d)
            except RegbenchError as exc:
                # One unreadable folder (`ingest results/*` meets a stray one) does not stop the rest.
                err.print(f"{d}: not ingested: {exc}", highlight=False, markup=False)
                failed += 1
                continue
            out.print(f"{d}: {'ingested' if stored else 'already there'} (run {run_id})", highlight=False, markup=False)
    finally:
        history.close()
    return EXIT_USAGE if failed else EXIT_PASS


def main(args: argparse.Namespace) -> int:
    if args.window < 1:
        raise ConfigError(f"--window {args.window}: must be at least 1")
    thresholds = parse_thresholds(args.threshold)
    # Stated only when they are not the defaults: a slowdown line names its own threshold anyway,
    # and a view at the defaults reads as it always has.
    in_effect = thresholds_in_effect(thresholds)
    stated = in_effect if in_effect != thresholds_in_effect() else None
    history = open_history(args.history or default_url(Path(args.results)), create=False)
    try:
        if args.cell is not None:
            known = history.cell_ids()
            if args.by != "time":
                # A series by its key or by any of its cells: both say which cell without its image.
                known = sorted({series_of(c) for c in known} | set(known))
            if args.cell not in known:
                what, listed = ("cell", "cells") if args.by == "time" else ("cell or series", "series and cells")
                raise ConfigError(f"--cell {args.cell}: no such {what} in the history {history.shown}"
                                  + (f"; {listed}: {', '.join(known)}" if known else " (it holds no run)"))
        cells = history.histories(args.cell, window=args.window, thresholds=thresholds, by=args.by)
        version = history.schema_version()
    finally:
        history.close()
    if args.html:
        page = render_trend(Trend(database=history.shown, schema_version=version, window=args.window,
                                  thresholds=stated, cells=cells, generated_at=time.time(), by=args.by))
        write_page(Path(args.html), page)
        err.print(f"trend page: {args.html}", highlight=False, markup=False)
    if args.format == "json":
        view = {"database": history.shown, "schema_version": version, "window": args.window, "by": args.by,
                **({"thresholds": stated} if stated else {}),
                "cells": [h.as_json() for h in cells]}
        print(json.dumps(view, indent=2))
        return EXIT_PASS
    if args.html:
        return EXIT_PASS
    if not cells:
        out.print(f"no run in the history {history.shown}: regbench history ingest DIR... adds some",
                  highlight=False, markup=False)
    for h in cells:
        out.print(history_table(h))
        for line in [*regression_lines(h), *slowdown_lines(h, args.window)]:
            out.print(line, highlight=False, markup=False)
    return EXIT_PASS
