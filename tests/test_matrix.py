from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.core.config import ConfigError, parse_config
from bench.core.matrix import expand


def _two_images(d):
    d["images"].append({"name": "img2", "python": "python3"})
    return d


def test_expansion_is_the_product_with_baselines_first(minimal):
    cells = expand(parse_config(_two_images(minimal)))
    assert [c.id for c in cells] == [
        "m__safetensors__cpu__img",
        "m__runai_streamer__cpu__img",
        "m__safetensors__cpu__img2",
        "m__runai_streamer__cpu__img2",
    ]
    assert cells[0].is_baseline and cells[0].baseline_id is None
    assert cells[1].baseline_id == "m__safetensors__cpu__img"
    assert cells[3].baseline_id == "m__safetensors__cpu__img2"


def test_ids_are_stable_and_filesystem_safe(minimal):
    a = [c.id for c in expand(parse_config(minimal))]
    b = [c.id for c in expand(parse_config(minimal))]
    assert a == b
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", i) and len(i) < 255 for i in a)


def test_exclude_and_include(minimal):
    d = _two_images(minimal)
    d["exclude"] = [{"load_format": "runai_streamer", "image": "img"}]
    assert [c.id for c in expand(parse_config(d))] == [
        "m__safetensors__cpu__img", "m__safetensors__cpu__img2", "m__runai_streamer__cpu__img2",
    ]
    d["exclude"] = []
    d["include"] = [{"image": "img2"}]
    assert {c.image.name for c in expand(parse_config(d))} == {"img2"}


def test_excluded_baseline_leaves_no_baseline(minimal):
    minimal["exclude"] = [{"load_format": "safetensors"}]
    (cell,) = expand(parse_config(minimal))
    assert cell.baseline_id is None and not cell.is_baseline


def test_filters_that_leave_nothing_are_an_error(minimal):
    minimal["include"] = [{"image": "img", "load_format": "safetensors"}]
    minimal["exclude"] = [{"image": "img"}]
    with pytest.raises(ConfigError, match="no cell"):
        expand(parse_config(minimal))


def test_plan_prints_cells(tmp_path, minimal, capsys):
    import yaml

    from bench.cli import main

    minimal["models"][0]["path"] = str(tmp_path)  # a local model path must exist
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(minimal))
    assert main(["plan", str(f)]) == 0
    out = capsys.readouterr().out
    assert "2 cells × 1 repeats = 2 fresh servers" in out
    assert "m__runai_streamer__cpu__img  [vs m__safetensors__cpu__img]" in out

    # The same plan for scripts: `--format json`, as compare, history, inspect and audit take it.
    assert main(["plan", str(f), "--format", "json", "--detect", "0.5"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert (view["name"], view["repeats"], view["fresh_servers"]) == ("t", 1, 2)
    assert [(c["id"], c["is_baseline"], c["baseline_id"], c["devices"]) for c in view["cells"]] == [
        ("m__safetensors__cpu__img", True, None, 1),
        ("m__runai_streamer__cpu__img", False, "m__safetensors__cpu__img", 1)]
    # 0.5 seen with 95 %: ceil(log 0.05 / log 0.5) = 5 repeats; one repeat sees it half the time.
    assert view["detect"] == {"rate": 0.5, "confidence": 0.95, "repeats_needed": 5, "seen_with_repeats": 0.5}


def test_a_baseline_rule_over_other_axes_compares_a_release_with_the_previous_one(minimal):
    d = _two_images(minimal)
    d["baseline"] = {"image": "img"}
    cells = expand(parse_config(d))
    by_id = {c.id: c for c in cells}
    assert [c.id for c in cells if c.is_baseline] == [c.id for c in cells[:2]]  # baselines run first
    assert by_id["m__safetensors__cpu__img2"].baseline_id == "m__safetensors__cpu__img"
    assert by_id["m__runai_streamer__cpu__img2"].baseline_id == "m__runai_streamer__cpu__img"


def test_a_baseline_rule_over_several_axes_gives_every_cell_one_reference(minimal):
    d = _two_images(minimal)
    d["baseline"] = {"load_format": "safetensors", "image": "img"}
    cells = expand(parse_config(d))
    assert [c.id for c in cells if c.is_baseline] == ["m__safetensors__cpu__img"]
    assert {c.baseline_id for c in cells if not c.is_baseline} == {"m__safetensors__cpu__img"}


@pytest.mark.parametrize(("baseline", "message"), [
    ({"image": "nope"}, "baseline 'nope' is not a known image"),
    ({}, "a baseline must name at least one axis"),
    ({"colour": "red"}, "baseline.colour: unknown key"),
])
def test_a_baseline_rule_naming_nothing_known_is_refused(minimal, baseline, message):
    minimal["baseline"] = baseline
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(minimal)


def test_a_cell_carries_what_every_stage_needs(minimal):
    from bench.core.config import Platform

    minimal["profiles"] = [{"name": "cpu", "devices": ["0"], "device_kind": "cpu", "env": {"X": "1"}}]
    config = parse_config(minimal)
    for cell in expand(config):
        assert cell.profile == config.profiles[0] and cell.profile.env == {"X": "1"}
        assert (cell.server, cell.workload, cell.comparison, cell.reference_text) == (
            config.server, config.workload, config.comparison, config.reference_text)
    # A matrix parsed without profiles runs its platforms with the defaults.
    del minimal["profiles"]
    assert expand(parse_config(minimal))[0].profile == Platform(name="cpu")


def test_a_platform_without_its_profile_is_refused_not_run_blank(minimal):
    minimal["platforms"] = ["cpu", "h200"]
    minimal["profiles"] = [{"name": "cpu"}]
    with pytest.raises(ConfigError, match=r"platforms \['h200'\] have no profile"):
        parse_config(minimal)


def test_a_model_given_several_tensor_parallel_sizes_is_one_model_per_size(minimal):
    """The size as an axis (vllm#48898: garbage only at TP 8): cell ids, baselines and filters
    name each size, and the expanded matrix reads back as it ran."""
    minimal["models"] = [{"name": "llama", "path": "/m", "tensor_parallel_size": [1, 8]}, {"name": "small", "path": "/s"}]
    minimal["load_formats"] = [{"name": "safetensors"}]
    minimal["baseline"] = {"model": "llama-tp1"}
    minimal["include"] = [{"model": "llama-tp1"}, {"model": "llama-tp8"}]
    config = parse_config(minimal)
    cells = {c.id: c for c in expand(config)}
    assert {i: (c.model.tensor_parallel_size, c.baseline_id) for i, c in cells.items()} == {
        "llama-tp1__safetensors__cpu__img": (1, None),
        "llama-tp8__safetensors__cpu__img": (8, "llama-tp1__safetensors__cpu__img"),
    }
    assert parse_config(config.model_dump(mode="json")) == config
    for sizes, says in (([], "each size once"), ([2, 2], "each size once"), ([0], "greater than or equal to 1")):
        minimal["models"][0]["tensor_parallel_size"] = sizes
        with pytest.raises(ConfigError, match=says):
            parse_config(minimal)


# The shipped GPU matrices: what they must carry and that their nights fit.
GPU_CONFIGS = ("configs/h200.yaml", "configs/dgx-spark.yaml", "configs/agx-thor.yaml")


def _plan_lines(path: str, capsys) -> list[str]:
    from bench.cli import main

    assert main(["plan", path]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("path", GPU_CONFIGS)
def test_shipped_gpu_configs_carry_the_numerics_independent_contract_probes(path, capsys):
    from bench.store.matrixfile import load_config

    _plan_lines(path, capsys)  # `regbench plan` validates it
    prompts = load_config(path).workload.prompts
    stops = [p for p in prompts if p.stop]
    schemas = {p.schema_field for p in prompts if p.json_schema is not None}
    choices = [p for p in prompts if p.n > 1]
    # never_stops needs a prompt that may end: no ignore_eos, no min_tokens, nothing else asked.
    ends = [p for p in prompts if p.ignore_eos is False and p.min_tokens == 0 and p.json_schema is None]
    assert stops and all(p.min_tokens in (None, 0) for p in stops)
    assert schemas == {"response_format", "structured_outputs"}
    assert choices and all(p.sampling is not None for p in choices)  # vLLM refuses n > 1 greedy
    assert ends and all(p.max_tokens and p.max_tokens >= 128 for p in ends)
    # Left out for their reasons (the configs' comments): numerics-dependent twins, token ids
    # the config cannot state, a tool parser not every image has.
    assert not [p.id for p in prompts if p.top_logprobs or p.logit_bias or p.prompt_ids or p.tools]
    assert not [p.id for p in prompts if p.sampling is not None and p.n == 1]


def _qualify_timeout_minutes() -> int:
    import yaml

    workflow = yaml.safe_load(Path(".github/workflows/qualify.yml").read_text())
    return int(workflow["jobs"]["run"]["timeout-minutes"])


@pytest.mark.parametrize(("path", "starts"), [("configs/dgx-spark.yaml", 84), ("configs/agx-thor.yaml", 72)])
def test_a_unified_memory_night_fits_the_nightly_job_and_says_so(path, starts, capsys):
    from bench.core.matrix import expected_times
    from bench.store.matrixfile import load_config

    config = load_config(path)
    (night,) = expected_times(config, expand(config))
    assert night.starts == starts
    assert config.budget is not None
    assert night.minutes <= config.budget.minutes < _qualify_timeout_minutes()
    text = Path(path).read_text()
    # And what the full #38991 matrix (three load formats, 8 repeats) would take at the same costs.
    full = parse_config({**config.model_dump(mode="json"), "repeats": 8, "detect": None, "load_formats": [
        *[f.model_dump(mode="json") for f in config.load_formats],
        {"name": "runai_streamer-c16", "format": "runai_streamer", "model_loader_extra_config": {"concurrency": 16}}]})
    (whole,) = expected_times(full, expand(full))
    assert whole.starts == 144 and whole.minutes > _qualify_timeout_minutes()
    assert f"would take {whole.minutes:.0f} min ({whole.hours:.1f} h)" in " ".join(text.replace("#", "").split())


@pytest.mark.parametrize("path", GPU_CONFIGS)
def test_gpu_configs_quote_what_plan_says_of_their_night(path, capsys):
    from bench.store.matrixfile import load_config

    platform = load_config(path).platforms[0]
    stated = [line for line in _plan_lines(path, capsys) if line.startswith((f"{platform}: ", "power: "))]
    assert len(stated) == 2
    text = Path(path).read_text()
    for line in stated:
        assert f"#   {line}\n" in text


def test_expected_time_spreads_fresh_servers_over_the_devices(minimal):
    from bench.core.matrix import expected_times

    minimal.update(repeats=3, budget={"minutes": 100, "boot_minutes": 10, "serve_minutes": 2, "setup_minutes": 5})
    (one,) = expected_times(c := parse_config(minimal), expand(c))
    assert (one.starts, one.devices, one.minutes) == (6, 1, 5 + 6 * 12)
    minimal["profiles"] = [{"name": "cpu", "devices": ["0", "1"], "device_kind": "cpu"}]
    (two,) = expected_times(c := parse_config(minimal), expand(c))
    assert (two.starts, two.devices, two.minutes) == (6, 2, 5 + 6 * 12 / 2)


def test_plan_refuses_a_plan_over_its_budget(tmp_path, minimal, capsys):
    import yaml

    from bench.cli import main

    minimal["models"][0]["path"] = str(tmp_path)
    minimal.update(repeats=3, budget={"minutes": 60, "boot_minutes": 10, "serve_minutes": 2, "setup_minutes": 5})
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(minimal))
    for fmt in ("text", "json", "github-matrix"):
        assert main(["plan", str(f), "--format", fmt]) == 2
        assert "over its budget of 60 min: cpu (77 min)" in capsys.readouterr().err
    minimal["budget"]["minutes"] = 80
    f.write_text(yaml.safe_dump(minimal))
    assert main(["plan", str(f)]) == 0
    assert ("cpu: 6 fresh servers × (10 min boot + 2 min serving) + 5 min setup = 77 min (1.3 h), "
            "within the budget of 80 min") in capsys.readouterr().out
