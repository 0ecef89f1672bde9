"""`regbench inspect`: a checkpoint's safetensors headers."""

from __future__ import annotations

import argparse

from bench.console import (
    emit,
    format_flag,
)
from bench.weights.checkpoint import inspect_checkpoint
from bench.weights.render import render_checkpoint


def add_cli_args(sub) -> None:
    insp = sub.add_parser("inspect", help="read a checkpoint's safetensors headers: shards, index, dtypes, #157 risk")
    insp.add_argument("ckpt", help="checkpoint directory, or s3://bucket/prefix (read with ranged requests under "
                                   "AWS_ENDPOINT_URL or RUNAI_STREAMER_S3_ENDPOINT and the AWS credential variables)")
    format_flag(insp, ["text", "json"], "text (default): the report for people; json: the report as JSON")
    insp.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    report = inspect_checkpoint(args.ckpt)
    return emit(report, args.format, render_checkpoint)
