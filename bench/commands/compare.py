"""`regbench compare`: two results folders cell by cell; exit 1 on a regression."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.console import (
    compare_flags,
    comparison,
    format_flag,
    out,
)
from bench.core.compare import AXES, compare, format_comparison
from bench.core.errors import EXIT_FAIL, EXIT_PASS
from bench.core.perf import parse_thresholds, threshold_list
from bench.store.publish import load_side, open_results


def add_cli_args(sub) -> None:
    cmp = sub.add_parser(
        "compare", help="compare two results folders (e.g. image tag N-1 and N); exit 1 on a regression",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Re-judges both results folders from their JSONL and compares them cell by cell.\n\n"
            "Cells are matched by cell id (model__load-format__platform__image). When no cell id is\n"
            "common to both (the same matrix run on another image tag), the image axis is ignored\n"
            "automatically and cells are matched by model, load format and platform; --match-ignore\n"
            "names the axes to leave out explicitly. A key matching two cells of one run is an error.\n\n"
            "Reports verdict changes, new failure reasons, output divergence per prompt (first\n"
            "differing token of each cell's first clean run, by --compare-mode) and fingerprint\n"
            "changes (vLLM,\n"
            "runai-model-streamer, torch, ... and image digest).\n\n"
            "Performance: per metric, the ratio of the cells' medians over runs with a bootstrap 95 %\n"
            "interval; 'slower' when the whole interval lies beyond the metric's threshold, 'cannot\n"
            "tell' when it straddles it or a side has fewer than 3 runs.\n\n"
            "Exit 1 on a regression: a matched cell that passed in A and fails or is flaky in B, that\n"
            "is slower in B, or that shows failure reasons in B it did not show in A. Exit 0 otherwise (cells only in\n"
            "one run and output divergence alone are reported, not regressions); 2 on usage errors."
        ),
    )
    cmp.add_argument("a", metavar="RESULTS_A", help="the reference run's results folder (e.g. the previous tag)")
    cmp.add_argument("b", metavar="RESULTS_B", help="the run under test's results folder")
    cmp.add_argument("--match-ignore", action="append", choices=AXES, default=[], metavar="AXIS",
                     help=f"match cells without this axis ({', '.join(AXES)}); repeatable")
    format_flag(cmp, ["text", "json"], "text (default): the comparison for people; json: the comparison as JSON")
    cmp.add_argument("--threshold", action="append", default=[], metavar="METRIC=RATIO",
                     help="slowdown threshold of one metric (repeatable), e.g. boot_s=1.5; metrics and their "
                          f"defaults: {threshold_list()}")
    cmp.add_argument("--verbose", action="store_true", help="also list the metrics that did not change")
    compare_flags(cmp, "compare outputs by this rule (default: run A's config's `comparison`)")
    cmp.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    thresholds = parse_thresholds(args.threshold)
    rule = comparison(args, Path(args.a))
    if rule is None:  # the reference run's own rule
        own = open_results(Path(args.a)).config().comparison
        rule = own.model_copy(update={"top_k": args.top_k or own.top_k})
    a, b = load_side(Path(args.a), rule), load_side(Path(args.b), rule)
    result = compare(a, b, ignore=frozenset(args.match_ignore), comparator=rule.comparator, thresholds=thresholds)
    if args.format == "json":
        print(result.model_dump_json(indent=2))
    else:
        for line in format_comparison(result, verbose=args.verbose):
            out.print(line, highlight=False, markup=False)
    return EXIT_FAIL if result.regressions else EXIT_PASS
