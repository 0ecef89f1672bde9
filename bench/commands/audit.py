"""`regbench audit`: every tensor streamed through the real loader and compared with the files."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.console import (
    emit,
    env_pairs,
    err,
    format_flag,
    name_list,
)
from bench.core.config import ConfigError
from bench.weights.audit import DEFAULT_TIMEOUT_S, LOADERS, ORDERS, audit_checkpoint, default_python
from bench.weights.render import render_audit


def add_cli_args(sub) -> None:
    audit = sub.add_parser("audit", help="stream every tensor through the real loader and compare with the files")
    audit.add_argument("ckpt", help="checkpoint directory, or s3://bucket/prefix (streamed through the streamer's S3 "
                                    "back-end, runai-model-streamer-s3, under the same variables as inspect)")
    audit.add_argument("--python", help="Python of the system under test (default: .venv-vllm/bin/python, else python3)")
    audit.add_argument("--pythonpath", nargs="+", action="extend", default=[], metavar="DIR",
                       help="overlay put first on PYTHONPATH, e.g. one runai-model-streamer version")
    audit.add_argument("--orders", default=",".join(ORDERS), help="comma-separated file orders: sorted, reversed, listing")
    audit.add_argument("--shuffles", type=int, default=0, help="this many seeded random orders besides")
    audit.add_argument("--seed", type=int, default=0, help="seed of the shuffles")
    audit.add_argument("--env", nargs="+", action="extend", default=[], metavar="K=V",
                       help="environment of the loader, e.g. RUNAI_STREAMER_MEMORY_LIMIT=0")
    audit.add_argument("--loaders", default=",".join(LOADERS),
                       help="comma-separated: streamer (SafetensorsStreamer), vllm (vLLM's iterator, where vllm imports)")
    audit.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the whole read may take")
    audit.add_argument("--image", metavar="REF",
                       help="run the reader in a container of this image (present here, nothing is pulled; no network): "
                            "--python is then the image's (default python3) and --pythonpath names folders inside it")
    format_flag(audit, ["text", "json"], "text (default): the report for people; json: the report as JSON")
    audit.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    orders = name_list(args.orders, "--orders", ORDERS) if args.orders.strip() else []
    loaders = name_list(args.loaders, "--loaders", LOADERS)
    if not orders and not args.shuffles:
        raise ConfigError("nothing to audit: give --orders or --shuffles")
    if args.shuffles < 0:
        raise ConfigError("--shuffles must be >= 0")
    if args.image:  # the image's Python, and folders inside the image
        python, pythonpath, where = args.python or "python3", list(args.pythonpath), f" in a container of {args.image}"
    else:
        for d in args.pythonpath:
            if not Path(d).is_dir():
                raise ConfigError(f"--pythonpath {d}: not a directory")
        python, pythonpath, where = args.python or default_python(), [str(Path(d).resolve()) for d in args.pythonpath], ""
    err.print(f"streaming {args.ckpt} with {python}{where} …", highlight=False)
    report = audit_checkpoint(
        args.ckpt, python, pythonpath, env_pairs(args.env),
        orders=orders, shuffles=args.shuffles, seed=args.seed, loaders=loaders, timeout_s=args.timeout,
        image_ref=args.image, pull="never",
    )
    return emit(report, args.format, render_audit)
