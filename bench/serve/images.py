"""Images of the docker launcher: pulled, pinned to what the registry answered, and checked
against this host before any container of them starts.

Images are resolved once per run, before the first cell (``DockerLauncher.resolve_images`` in
bench.serve.launch_docker, called by the runner's ``prepare``, through ``resolve`` here): the pull
policy is applied once per image, and every container of the run (the pre-flight audit's, the
fingerprint's, every repeat's server) is created from the image's digest, ``repo@sha256:...``, or
its image id when it exists only here with no registry digest. A tag that moves mid-run changes
nothing for later repeats; a resumed run is pinned to what its fingerprint recorded. An image whose
registry cannot be asked (down, credentials refused) is one ImageUnavailable (a ConfigError: exit 2)
before any cell, naming each ref and the answer, not a boot failure per repeat; an image the
registry has no build of for this host (a tag not published, an index without this host's
platform) makes its own cells not runnable, in the registry's words (not_here), and the rest of the
matrix runs. An image that is here but cannot run here (another architecture, an
NVIDIA_REQUIRE_* this host's driver fails: not_runnable; a start the NVIDIA container toolkit
refuses: toolkit_refusal) is not runnable too, in the same words.
"""

from __future__ import annotations

import platform as _platform
import re
from collections.abc import Mapping
from dataclasses import dataclass

import docker
import docker.errors
import requests.exceptions
from docker.models.images import Image as DockerImage
from docker.utils import parse_repository_tag

from bench.core.config import Image
from bench.core.verdicts import NOT_RUNNABLE
from bench.serve.cuda_require import Driver
from bench.serve.cuda_require import unmet as cuda_unmet
from bench.serve.errors import ImageUnavailable, StartError


class ImageNotHere(Exception):
    """An image the registry has no build of for this host: its tag is not published (an RC tag
    announced before it is pushed), or its index has no manifest for this host's platform (an
    amd64-only tag on DGX Spark or Jetson Thor). Its cells are not runnable; the others run. The
    message starts with bench.core.verdicts.NOT_RUNNABLE and quotes the registry."""


# The engine's answers, as Docker 20.10 and later word them for a registry's 404 on a tag
# ("manifest for REPO:TAG not found: manifest unknown: manifest unknown") and for an index without
# the platform asked ("no matching manifest for linux/arm64/v8 in the manifest list entries").
_NO_TAG = re.compile(r"manifest for \S+ not found|manifest unknown")
_NO_PLATFORM = re.compile(r"no matching manifest for (\S+)")


def not_here(ref: str, said: str) -> str | None:
    """A pull's failure as a not-runnable reason when it means this host can have no build of
    the image (pure); None for any other failure (the registry down, credentials refused)."""
    platform = _NO_PLATFORM.search(said)
    if platform is not None:
        return (f"{NOT_RUNNABLE}: image {ref} has no build for this host's platform ({platform.group(1)}); "
                f"the registry's index lists others only: {said}")
    if _NO_TAG.search(said):
        return f"{NOT_RUNNABLE}: image {ref} is not published (the registry has no such tag): {said}"
    return None


def pull(c: docker.DockerClient, ref: str) -> DockerImage:
    """Pulls `ref` and returns the image; raises APIError with the engine's own words. The SDK's
    images.pull drops an error the engine sends inside the pull's stream (an index without this
    host's platform: "no matching manifest for linux/arm64/v8 in the manifest list entries") and
    then fails on "No such image"."""
    repo, tag = parse_repository_tag(ref)
    for line in c.api.pull(repo, tag=tag or "latest", stream=True, decode=True):
        if isinstance(line, dict) and line.get("error"):
            said = str(line.get("errorDetail", {}).get("message") or line["error"])
            raise docker.errors.APIError(said, explanation=said)
    return c.images.get(ref)


def ensure_image(c: docker.DockerClient, image: Image) -> DockerImage:
    """Applies the pull policy; raises StartError when the image cannot be had."""
    assert image.ref is not None
    try:
        if image.pull == "always":
            return pull(c, image.ref)
        try:
            return c.images.get(image.ref)
        except docker.errors.ImageNotFound:
            if image.pull == "never":
                raise StartError(f"image {image.ref} is not present and pull is 'never'") from None
            return pull(c, image.ref)
    except docker.errors.APIError as exc:
        raise StartError(f"image {image.ref}: {exc.explanation or exc}") from None


def repository(ref: str) -> str:
    """The repository of a reference, as the engine names it in RepoDigests (pure): no tag or
    digest, Docker Hub's implicit `docker.io/` and `library/` left out."""
    repo = parse_repository_tag(ref)[0]
    for prefix in ("docker.io/", "index.docker.io/"):
        if repo.startswith(prefix):
            repo = repo[len(prefix):]
    return repo.removeprefix("library/")


@dataclass(frozen=True)
class Resolved:
    """An image of the run as resolved before the cells: `pin` is what every container is
    created from, the registry digest of the asked repository (`repo@sha256:...`) or, for an
    image that exists only here, its image id."""

    ref: str  # as the matrix asked
    pin: str
    image_id: str
    digest: str | None  # repo@sha256:... ; None for an image built here and never pushed
    pulled: bool  # the policy pulled it (or a resumed run's digest) for this run


def pin_of(img: DockerImage, ref: str) -> tuple[str, str | None]:
    """(pin, digest) of an image resolved from `ref` (pure): the digest of ref's repository; the
    image id when it has none (an image tagged into another repository keeps its own digests)."""
    repo = repository(ref)
    digests = [str(d) for d in img.attrs.get("RepoDigests") or []]
    mine = [d for d in digests if repository(d.split("@", 1)[0]) == repo]
    if mine:
        return mine[0], mine[0]
    return str(img.id), (digests[0] if digests else None)


def resolve(c: docker.DockerClient, image: Image, earlier: str | None = None) -> Resolved:
    """Applies the pull policy once (or, for a resumed run, finds the pin it recorded before,
    pulling it by digest when the policy allows); raises ImageUnavailable."""
    ref = image.ref
    assert ref is not None
    pulled = False
    try:
        if earlier is not None:
            try:
                img = c.images.get(earlier)
            except docker.errors.ImageNotFound:
                if image.pull == "never" or "@" not in earlier:
                    raise ImageUnavailable(
                        f"image {ref}: this run was pinned to {earlier}, which is not present here "
                        f"(pull: {image.pull})") from None
                img, pulled = pull(c, earlier), True
            pin = earlier
            _, digest = pin_of(img, ref)
            digest = earlier if "@" in earlier else digest
            return Resolved(ref, pin, str(img.id), digest, pulled)
        if image.pull == "always":
            img, pulled = pull(c, ref), True
        else:
            try:
                img = c.images.get(ref)
            except docker.errors.ImageNotFound:
                if image.pull == "never":
                    raise ImageUnavailable(f"image {ref} is not present here and its pull policy is 'never'") from None
                img, pulled = pull(c, ref), True
    except docker.errors.APIError as exc:
        said = str(exc.explanation or exc).strip()
        if image.pull != "never" and (reason := not_here(ref, said)) is not None:
            raise ImageNotHere(reason) from None
        raise ImageUnavailable(f"image {ref}: {'pull' if image.pull != 'never' else 'lookup'} failed: {said}") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise ImageUnavailable(f"image {ref}: the Docker engine did not answer: {exc}") from None
    pin, digest = pin_of(img, ref)
    return Resolved(ref, pin, str(img.id), digest, pulled)


# platform.machine() → the architecture names of image configs (OCI / Go's GOARCH).
OCI_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm",
            "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}


def not_runnable(ref: str, attrs: Mapping, machine: str | None = None, driver: Driver | None = None) -> str | None:
    """Why an image cannot run on this host (pure given `machine` and `driver`), or None: its
    architecture (`docker image inspect`'s Architecture) against the host's, and where the host has
    NVIDIA's driver (`driver`, from nvidia-smi) the image's NVIDIA_REQUIRE_* read as the NVIDIA
    container toolkit reads them (bench.serve.cuda_require): only what fails whatever the toolkit
    alone knows (brand, compatibility libraries) is said here; the rest the toolkit decides at
    start (toolkit_refusal). The reason starts with bench.core.verdicts.NOT_RUNNABLE, which the
    judge reports as `not_runnable`."""
    unmet = cuda_unmet(attrs, driver) if driver is not None else None
    if unmet is not None:
        return f"{NOT_RUNNABLE}: image {ref} {unmet}; no container was started"
    machine = machine or _platform.machine()
    arch, os_ = attrs.get("Architecture"), attrs.get("Os")
    host = OCI_ARCH.get(machine, machine)
    if arch and arch != host:
        return (f"{NOT_RUNNABLE}: image {ref} is {os_ or 'linux'}/{arch}{'/' + attrs['Variant'] if attrs.get('Variant') else ''}"
                f", this host is {host} ({machine}); no container was started")
    if os_ and os_ != "linux":
        return f"{NOT_RUNNABLE}: image {ref} is for {os_}, this host runs linux containers"
    return None


# What the engine answers when the NVIDIA container toolkit's prestart hook refuses a container:
# libnvidia-container's own words on its stderr, e.g. "nvidia-container-cli: requirement error:
# unsatisfied condition: cuda>=12.8, please update your driver to a newer version, or use an
# earlier cuda container" (NVIDIA/nvidia-container-toolkit issue #152; SyneRBI/PETRIC2 issue #27).
# And an engine with no NVIDIA runtime at all: moby's "could not select device driver "" with
# capabilities: [[gpu]]".
_TOOLKIT_REFUSAL = re.compile(r'(nvidia-container-cli: [^\n\\"]*)|(could not select device driver[^\n\\]*)')


def toolkit_refusal(ref: str, message: str) -> str | None:
    """A container start refused by the host's NVIDIA container toolkit (or an engine without
    it), as a not-runnable reason in the toolkit's own words (pure); None for any other failure."""
    m = _TOOLKIT_REFUSAL.search(message)
    if m is None:
        return None
    if m.group(1):
        words = re.sub(r"(:\s*unknown)?\.?\s*$", "", m.group(1))  # the engine's own suffix
        return f"{NOT_RUNNABLE}: the NVIDIA container toolkit refused image {ref}: {words}"
    return (f"{NOT_RUNNABLE}: this Docker engine cannot give containers GPUs ({m.group(2).strip()}): "
            "install NVIDIA's container toolkit and configure the engine's runtime (docs/qualify-gpu-host.md)")
