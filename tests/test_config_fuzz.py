"""Thousands of malformed matrices: each one ends in exit 2 with a message, never a traceback."""

from __future__ import annotations

import copy
import re
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.cli import main
from bench.core.config import ConfigError
from bench.core.matrix import expand
from bench.store.matrixfile import load_config

VALID = {
    "name": "t",
    "models": [{"name": "m", "path": "/models/m", "served_name": "m", "server_args": ["--dtype", "float32"]}],
    "load_formats": [{"name": "safetensors"}, {"name": "runai_streamer", "env": {"A": "1"}}],
    "images": [{"name": "img", "python": sys.executable, "pythonpath": ["/overlay"]}],
    "baseline": "safetensors",
    "repeats": 2,
    "exclude": [{"image": "img", "load_format": "runai_streamer", "model": "m"}],
    "server": {"args": [], "boot_timeout_s": 10},
    "workload": {"prompts": [{"id": "p", "prompt": "hi"}, {"id": "c", "kind": "chat",
                             "messages": [{"role": "user", "content": "x"}]}],
                 "min_tokens": 8, "max_tokens": 8, "concurrency": 2},
}

nasty_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["../etc/passwd", "a/../../b", "$(rm -rf /)", "`id`", "a;b", "a b", "a__b", "..", ".", "",
                     "ｍｏｄｅｌ", "名前", "a\x00b", "a\nb", "-rf", "x" * 300, "${HOME}", "'\"", "*", "%s%n"]),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), nasty_text,
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(nasty_text, inner, max_size=3)), max_leaves=6)


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, (*prefix, i))


ALL_PATHS = [p for p in paths(VALID) if p]


@st.composite
def broken(draw):
    config = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent = config
        try:
            for part in path[:-1]:
                parent = parent[part]
        except (KeyError, IndexError, TypeError):
            continue
        action = draw(st.sampled_from(["replace", "delete", "unknown-key", "duplicate", "empty"]))
        key = path[-1]
        try:
            if action == "replace":
                parent[key] = draw(values)
            elif action == "delete":
                del parent[key]
            elif action == "unknown-key" and isinstance(parent, dict):
                parent[draw(nasty_text)] = draw(values)
            elif action == "duplicate" and isinstance(parent.get(key) if isinstance(parent, dict) else None, list):
                parent[key] = parent[key] + parent[key]
            elif action == "empty":
                parent[key] = type(parent[key])() if isinstance(parent[key], (list, dict, str)) else None
        except (KeyError, IndexError, TypeError):
            continue
    return config


SAFE_ID = re.compile(r"^[A-Za-z0-9._-]+$")


TRIED = {"configs": 0, "rejected": 0}


@pytest.mark.fault("malformed matrix files (generated)")
@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(config=broken())
def test_no_matrix_ends_in_a_traceback(tmp_path, config, capsys, fault):
    f = tmp_path / "c.yaml"
    try:
        f.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    except (yaml.YAMLError, UnicodeEncodeError):
        return  # not representable as YAML: nothing a user could write
    code = main(["plan", str(f)])  # any exception other than exit codes fails the test
    err = capsys.readouterr().err
    assert code in (0, 2)
    assert "Traceback" not in err
    TRIED["configs"] += 1
    TRIED["rejected"] += code == 2
    fault("exit 2 with a message for every invalid one, 0 tracebacks", cases=TRIED["configs"])
    if code == 2:
        assert err.startswith("regbench: ")
    else:
        for cell in expand(load_config(f)):
            assert SAFE_ID.match(cell.id) and ".." not in cell.id.split("__")


VALID_TEXT = yaml.safe_dump(VALID, allow_unicode=True)


@st.composite
def edited_matrix(draw) -> str:
    """The valid matrix's YAML with one span replaced by arbitrary text: many edits keep it valid
    (a prompt's text, a name), many break it (an indent, a colon, a key's name)."""
    start = draw(st.integers(0, len(VALID_TEXT)))
    end = draw(st.integers(start, min(len(VALID_TEXT), start + 20)))
    return VALID_TEXT[:start] + draw(st.text(max_size=20)) + VALID_TEXT[end:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.text(max_size=200), edited_matrix(), st.binary(max_size=200)))
def test_arbitrary_text_is_a_config_error_or_valid(tmp_path, content):
    # Either a ConfigError whose message names the file (bytes that are not UTF-8 included), or a
    # matrix whose cells have ids that are safe as folder names; any other exception fails.
    f = tmp_path / "c.yaml"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content, encoding="utf-8")
    try:
        config = load_config(f)
    except ConfigError as exc:
        assert str(exc).startswith(f"{f}: ") and len(str(exc)) > len(f"{f}: "), exc
        return
    cells = expand(config)
    assert cells and all(SAFE_ID.match(c.id) and ".." not in c.id.split("__") for c in cells), cells
