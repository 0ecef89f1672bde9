"""docs/matrix.md's key reference is generated from the config models (scripts/matrix_reference.py):
it fails here when the page and the models drift apart, or a field has no description."""

from __future__ import annotations

import importlib.util
import sys

from bench.core import config

from .support import ROOT


def _script():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("matrix_reference", ROOT / "scripts" / "matrix_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_field_of_the_config_models_has_a_description():
    assert _script().missing_descriptions() == []


def test_docs_matrix_md_matches_the_models():
    ref = _script()
    page = (ROOT / "docs" / "matrix.md").read_text(encoding="utf-8")
    begin, end = "<!-- matrix-reference:begin -->", "<!-- matrix-reference:end -->"
    assert page[page.index(begin) + len(begin):page.index(end)].strip() == ref.reference(), (
        "docs/matrix.md differs from bench/core/config/: run scripts/matrix_reference.py --write")


def test_the_reference_names_every_key_and_a_changed_description_shows(monkeypatch):
    ref = _script()
    made = ref.reference()
    for name in config.Config.model_fields:
        assert f"| `{name}" in made, name
    for name in config.Workload.model_fields:
        assert f"| `{name}" in made, name
    field = config.ServerSettings.model_fields["boot_timeout_s"]
    monkeypatch.setattr(field, "description", "changed")
    assert ref.reference() != made
