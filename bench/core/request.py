"""A prompt as the request the bench sends: the one place its JSON body is made. Pure.

The client (bench.serve.client) sends it through the openai SDK, and the bug report writes it as
curl (bench.bugreport.gather), so the reproduction asks exactly what the bench asked, contract
probes and vLLM's own sampling fields included.
"""

from __future__ import annotations

from typing import Any

from bench.core.config import Prompt, Workload
from bench.core.probes import PROBES

# What the openai SDK takes as its own keywords; everything else travels as `extra_body`.
SDK_FIELDS = frozenset({"model", "prompt", "messages", "max_tokens", "temperature", "seed", "stream",
                        "stream_options", "logprobs", "top_logprobs", "stop", "logit_bias", "n", "tools",
                        "tool_choice", "parallel_tool_calls"})


def endpoint(prompt: Prompt) -> str:
    return "chat/completions" if prompt.kind == "chat" else "completions"


def request_body(prompt: Prompt, workload: Workload, model: str, top_k: int | None) -> dict[str, Any]:
    """The JSON body of a prompt's request, with what its contract probes add. `top_k`: the top
    logprobs every generated token is asked with (None: none), unless the prompt asks its own
    number (a logprobs-k probe)."""
    shape = prompt.request(workload)
    body: dict[str, Any] = {"model": model}
    if prompt.kind == "chat":
        body["messages"] = [m.model_dump() for m in prompt.messages or []]
    else:
        body["prompt"] = prompt.prompt_ids if prompt.prompt_ids is not None else prompt.prompt or ""
    body.update(max_tokens=shape.max_tokens, temperature=workload.temperature, seed=workload.seed,
                min_tokens=shape.min_tokens, ignore_eos=shape.ignore_eos, return_token_ids=True)
    if shape.stop_token_ids:
        body["stop_token_ids"] = list(shape.stop_token_ids)
    if prompt.stream:
        body.update(stream=True, stream_options={"include_usage": True})
    if top_k is not None:
        # Ids, not texts, for the alternatives: two ids can decode to the same text.
        body["return_tokens_as_token_ids"] = True
        body.update({"logprobs": True, "top_logprobs": top_k} if prompt.kind == "chat" else {"logprobs": top_k})
    for probe in PROBES:
        probe.add_to_body(prompt, body)
    return body


def sdk_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """The body as the SDK's keywords: its own fields, and the rest (vLLM's) as `extra_body`."""
    args = {k: v for k, v in body.items() if k in SDK_FIELDS}
    args["extra_body"] = {k: v for k, v in body.items() if k not in SDK_FIELDS}
    return args
