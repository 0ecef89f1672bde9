"""One spelling for machine-readable output across regbench's commands: `--format`, whose choices
include `json` and whose default is the command's human output. `--json`, the older spelling of
some commands, still parses (scripts and CI written for it keep working) but is no longer shown."""

from __future__ import annotations

import argparse

import pytest

from bench.cli import parser

# The commands whose output a script reads, and the name their docs give the human output.
MACHINE_READABLE = {"plan": "text", "compare": "text", "history": "table", "inspect": "text", "audit": "text"}


def subcommands(p: argparse.ArgumentParser, prefix: str = "regbench") -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by its command line, `history ingest` included."""
    found = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"{prefix} {name}"] = sub
                found.update(subcommands(sub, f"{prefix} {name}"))
    return found


def format_action(p: argparse.ArgumentParser) -> argparse.Action | None:
    return next((a for a in p._actions if "--format" in a.option_strings), None)


def test_every_command_is_found():
    found = subcommands(parser())
    assert {f"regbench {c}" for c in MACHINE_READABLE} <= set(found) and "regbench history ingest" in found


@pytest.mark.parametrize("command", sorted(subcommands(parser())))
def test_help_shows_format_never_json(command):
    sub = subcommands(parser())[command]
    shown = sub.format_help()
    assert "--json" not in shown
    name = command.split()[1]
    fmt = format_action(sub)
    if command == f"regbench {name}" and name in MACHINE_READABLE:
        assert fmt is not None and "--format" in shown
        assert "json" in fmt.choices and fmt.default == MACHINE_READABLE[name]
        assert "{" + ",".join(fmt.choices) + "}" in " ".join(shown.split())
    else:
        # A command that prints nothing for scripts offers no format to choose.
        assert fmt is None


@pytest.mark.parametrize("name", sorted(MACHINE_READABLE))
def test_json_is_a_deprecated_alias_of_format_json(name, capsys):
    positional = {"plan": ["m.yaml"], "compare": ["a", "b"], "history": [], "inspect": ["ckpt"], "audit": ["ckpt"]}[name]
    p = parser()
    assert p.parse_args([name, *positional]).format == MACHINE_READABLE[name]
    capsys.readouterr()
    assert p.parse_args([name, *positional, "--format", "json"]).format == "json"
    assert capsys.readouterr().err == ""
    assert p.parse_args([name, "--json", *positional]).format == "json"
    said = capsys.readouterr().err
    assert said.strip() == "regbench: --json is deprecated; use --format json" and said.count("\n") == 1
