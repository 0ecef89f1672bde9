"""Tags resolved to digests once, for every slice of a run (`regbench plan --format pins`).

A tag such as a nightly's moves, and the slices of one run (CI jobs on several hosts, started at
different times) each resolve it on their own (bench.serve.images.resolve): two slices can
run two builds, and `regbench merge` refuses them. Asked once, the registry's answer for each tag,
`REPO@sha256:…`, given to every slice as `--image NAME=REF`, makes them run one build. The
registry is asked through the Docker engine (its distribution endpoint, with the client's
registry credentials): nothing is pulled, so the host that plans needs no room for the images.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import docker
import docker.errors
import requests.exceptions
from docker.utils import parse_repository_tag

from bench.core.config import Image
from bench.serve.images import ImageUnavailable, not_here


def registry_pins(images: Iterable[Image], engine: Callable[[], docker.DockerClient]) -> tuple[dict[str, str], list[str]]:
    """(image name -> the reference every slice is to run, notes): the registry's digest of each
    tag; a reference that is a digest already as it is; an image under `pull: never` as it is,
    with a note (each host runs its own copy, which no registry can name), and so is a tag the
    registry does not have, with a note. `engine` is called only when a tag is to be asked for.
    Raises one ImageUnavailable naming every tag the registry could not be asked about."""
    c: docker.DockerClient | None = None
    pins: dict[str, str] = {}
    notes, failures = [], []
    for image in images:
        ref = image.ref
        if ref is None:
            continue  # a launcher that pulls nothing
        if "@" in ref:
            pins[image.name] = ref
            continue
        if image.pull == "never":
            pins[image.name] = ref
            notes.append(f"image {image.name}: {ref} not pinned (pull: never runs each host's own copy; "
                         "`regbench merge` refuses slices whose copies differ)")
            continue
        c = c or engine()
        try:
            digest = c.images.get_registry_data(ref).id
        except docker.errors.APIError as exc:
            said = str(exc.explanation or exc).strip()
            if not_here(ref, said) is not None:
                # Not published (yet): left as it is, every slice says its cells are not runnable,
                # and the other images still run (one RC tag must not end a night).
                pins[image.name] = ref
                notes.append(f"image {image.name}: {ref} not pinned: the registry has no such tag ({said}); "
                             "its cells will be not runnable")
                continue
            failures.append(f"image {ref}: the registry did not resolve it: {said}")
            continue
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            failures.append(f"image {ref}: the Docker engine did not answer: {exc}")
            continue
        repo, _ = parse_repository_tag(ref)
        pins[image.name] = f"{repo}@{digest}"
    if failures:
        raise ImageUnavailable("; ".join(failures))
    return pins, notes
