"""A prompt as the request the bench sends: the one place its JSON body is made. Pure.

The client (bench.serve.client) sends it through the openai SDK, and the bug report writes it as
curl (bench.bugreport.gather), so the reproduction asks exactly what the bench asked, contract
probes and vLLM's own sampling fields included.
"""

from __future__ import annotations

from typing import Any

from bench.core.config import Prompt, Workload

# What the openai SDK takes as its own keywords; everything else travels as `extra_body`.
SDK_FIELDS = frozenset({"model", "prompt", "messages", "max_tokens", "temperature", "seed", "stream",
                        "stream_options", "logprobs", "top_logprobs", "stop", "logit_bias", "n", "tools",
                        "tool_choice", "parallel_tool_calls"})


def endpoint(prompt: Prompt) -> str:
    return "chat/completions" if prompt.kind == "chat" else "completions"


def request_body(prompt: Prompt, workload: Workload, model: str, top_k: int | None) -> dict[str, Any]:
    """The JSON body of a prompt's request. `top_k`: the top logprobs every generated token is
    asked with (None: none), unless the prompt asks its own number (a logprobs-k probe)."""
    shape = prompt.request(workload)
    sampling = prompt.sampling  # a seed probe's, instead of the workload's
    body: dict[str, Any] = {"model": model}
    if prompt.kind == "chat":
        body["messages"] = [m.model_dump() for m in prompt.messages or []]
    else:
        body["prompt"] = prompt.prompt_ids if prompt.prompt_ids is not None else prompt.prompt or ""
    body.update(max_tokens=shape.max_tokens,
                temperature=sampling.temperature if sampling else workload.temperature,
                seed=sampling.seed if sampling else workload.seed,
                min_tokens=shape.min_tokens, ignore_eos=shape.ignore_eos, return_token_ids=True)
    stop_ids = workload.stop_token_ids if prompt.stop_token_ids is None else prompt.stop_token_ids
    if stop_ids:
        body["stop_token_ids"] = list(stop_ids)
    if prompt.stream:
        body.update(stream=True, stream_options={"include_usage": True})
    top_k = prompt.top_logprobs or top_k
    if top_k is not None:
        # Ids, not texts, for the alternatives: two ids can decode to the same text.
        body["return_tokens_as_token_ids"] = True
        body.update({"logprobs": True, "top_logprobs": top_k} if prompt.kind == "chat" else {"logprobs": top_k})
    if prompt.stop:
        body["stop"] = list(prompt.stop)
    if prompt.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in prompt.logit_bias.items()}
    if prompt.n > 1:
        body["n"] = prompt.n
    if prompt.json_schema is not None and prompt.schema_field == "structured_outputs":
        body["structured_outputs"] = {"json": prompt.json_schema}
    elif prompt.json_schema is not None and prompt.schema_field == "guided_json":
        body["guided_json"] = prompt.json_schema
    elif prompt.json_schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": prompt.id.replace(".", "_"), "schema": prompt.json_schema}}
    if prompt.tools is not None:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True)} for t in prompt.tools]
        choice = prompt.tool_choice
        body["tool_choice"] = choice if choice in ("none", "auto", "required") else \
            {"type": "function", "function": {"name": choice}}
        if choice == "required":
            # One call: a model that may call again and again fills max_tokens with calls (the
            # tiny canary does). A named choice is one call already; asking this of it makes
            # vLLM 0.32 wrap it in the parser's own call format, measured to run the tiny
            # canary's arguments to max_tokens.
            body["parallel_tool_calls"] = False
    return body


def sdk_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """The body as the SDK's keywords: its own fields, and the rest (vLLM's) as `extra_body`."""
    args = {k: v for k, v in body.items() if k in SDK_FIELDS}
    args["extra_body"] = {k: v for k, v in body.items() if k not in SDK_FIELDS}
    return args
