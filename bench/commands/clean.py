"""`regbench clean`: what killed benches left running, removed by label."""

from __future__ import annotations

import argparse

from bench.serve.launchers import remove_leftovers


def add_cli_args(sub) -> None:
    clean_p = sub.add_parser("clean", help="stop servers and remove containers a killed bench left behind (by label)")
    clean_p.add_argument("--run-id", help="only those of this run (default: all of regbench's on this host)")
    clean_p.add_argument("--all", action="store_true",
                         help="also those whose bench still runs, or ran on another host (default: only those of "
                              "benches that are gone; what is left is said)")
    clean_p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Removes what a killed bench left running, of every launcher back-end, found by labels; by
    default only what belongs to benches that are gone (a shared host runs benches side by side)."""
    for name, (removed, kept) in remove_leftovers(args.run_id, only_gone=not args.all).items():
        print(f"{name} launcher: removed {len(removed)} leftover(s)" + (": " + ", ".join(removed) if removed else ""))
        if kept:
            print(f"{name} launcher: left {len(kept)} (--all removes them too): " + "; ".join(kept))
    return 0
