from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.core.config import ConfigError, parse_config
from bench.store.matrixfile import load_config

from .support import ROOT, needs


def test_minimal_has_the_bench_defaults(minimal):
    config = parse_config(minimal)
    assert config.workload.min_tokens == config.workload.max_tokens == 128
    assert config.workload.ignore_eos is True
    assert config.workload.temperature == 0
    assert config.platforms == ["cpu"]
    assert config.server.host == "127.0.0.1"


@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (lambda d: d.update(repeat=3), "repeat", "unknown key"),
        (lambda d: d["workload"].update(max_tokens="many"), "workload.max_tokens", "integer"),
        (lambda d: d["workload"].update(min_tokens=200), "workload", "min_tokens (200) > max_tokens (128)"),
        (lambda d: d["models"][0].update(nmae="x"), "models.0.nmae", "unknown key"),
        (lambda d: d.update(models=[]), "models", "at least 1"),
        (lambda d: d.update(repeats=-1), "repeats", "must be 1..10000 or auto"),
        (lambda d: d.update(repeats="auto"), "(top level)", "repeats: auto needs `detect"),
        (lambda d: d.update(repeats="auto", detect={"rate": 0.0001, "confidence": 0.999}), "(top level)", "at most 10000"),
        (lambda d: d.update(baseline="nope"), "(top level)", "baseline 'nope'"),
        (lambda d: d["images"][0].update(name="../etc"), "images.0.name", "not a name"),
        (lambda d: d["images"][0].update(name="a__b"), "images.0.name", "no '__'"),
        (lambda d: d["load_formats"].append({"name": "safetensors"}), "(top level)", "duplicate load format"),
        (lambda d: d.update(exclude=[{"image": "other"}]), "(top level)", "unknown image 'other'"),
        (lambda d: d.update(exclude=[{}]), "exclude.0", "at least one axis"),
        (lambda d: d["workload"]["prompts"].append({"id": "c", "kind": "chat", "prompt": "x"}),
         "workload.prompts.1", "chat prompt needs `messages`"),
        (lambda d: d["images"][0].update(env={"BAD-NAME": "1"}), "images.0.env", "not an environment variable"),
        (lambda d: d["server"].update(host="0.0.0.0") if "server" in d else d.update(server={"host": "0.0.0.0"}),
         "server.host", "127.0.0.1"),
    ],
)
def test_invalid_matrices_name_the_key_path(minimal, mutate, path, words):
    mutate(minimal)
    with pytest.raises(ConfigError) as info:
        parse_config(minimal)
    message = str(info.value)
    assert f"{path}:" in message
    assert words in message


def test_cli_exits_2_with_message_and_no_traceback(tmp_path, minimal, capsys):
    minimal["workload"]["min_tokens"] = 500
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(minimal))
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "min_tokens (500) > max_tokens (128)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("text", ["models: [unclosed", "- a list\n- not a mapping\n", ""])
def test_unreadable_yaml_is_a_config_error(tmp_path, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError):
        load_config(f)


def test_missing_file_is_exit_2(tmp_path):
    assert main(["plan", str(tmp_path / "nope.yaml")]) == 2


def test_paths_resolve_against_the_file_without_following_symlinks(tmp_path, minimal):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    os.symlink("/usr/bin/env", venv_bin / "python")
    (tmp_path / "models" / "m").mkdir(parents=True)
    minimal["models"][0]["path"] = "models/m"
    minimal["models"].append({"name": "hub", "path": "org/some-model"})
    minimal["images"][0].update(python="venv/bin/python", pythonpath=["overlay"])
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(minimal))
    config = load_config(f)
    assert config.images[0].python == str(venv_bin / "python")  # the symlink itself
    assert config.images[0].pythonpath == [str(tmp_path / "overlay")]
    assert config.models[0].path == str(tmp_path / "models" / "m")
    assert config.models[1].path == "org/some-model"  # not local: a hub id, untouched


@pytest.mark.parametrize("path", ["./no-such-model", "../no-such-model", "/no/such/model", "~/no-such-model-here"])
def test_a_local_looking_model_path_that_does_not_exist_is_a_config_error_naming_the_key(tmp_path, minimal, path,
                                                                                         capsys):
    minimal["models"][0]["path"] = str(tmp_path)
    minimal["models"].append({"name": "gone", "path": path})
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(minimal))
    assert main(["plan", str(f)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"models.1.path: {path!r} looks like a local path" in err and "does not exist" in err, err
    (tmp_path / "here").mkdir()
    minimal["models"][1]["path"] = "./here"
    f.write_text(yaml.safe_dump(minimal))
    assert load_config(f).models[1].path == str(tmp_path / "here")


def _local_models(config: Path) -> list[Path]:
    """The model folders a shipped matrix names by a local path: loading it checks that they exist."""
    paths = [m["path"] for m in yaml.safe_load(config.read_text())["models"]]
    return [(config.parent / p).resolve() for p in paths if p.startswith(("./", "../", "/"))]


SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", [
    pytest.param(c, id=c.name, marks=[needs(p, f"the model {p.name} (.cache/models)") for p in _local_models(c)])
    for c in SHIPPED])
def test_shipped_configs_are_valid(config):
    load_config(config)


def test_the_shipped_configs_are_found():
    assert {"cpu-smoke.yaml", "h200.yaml"} <= {c.name for c in SHIPPED}
